"""API keys are stored hashed and checked on use; client-chosen names cannot escape."""

import pytest

from twinkle.server.auth import authenticate, create_key
from twinkle.server.errors import BadRequest, Unauthorized
from twinkle.server.names import check_name, parse_uri
from twinkle.server.store import SQLiteStore


def test_keys_are_tml_and_only_their_hash_is_stored(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    key, record = create_key(store, "alice")
    assert key.startswith("tml-") and len(key) > 40
    store.close()
    assert key.encode() not in (tmp_path / "s.db").read_bytes()
    store = SQLiteStore(tmp_path / "s.db")
    assert authenticate(store, key).key_id == record.id
    assert store.revoke_key(record.id, 1.0)
    with pytest.raises(Unauthorized, match="revoked"):
        authenticate(store, key)


@pytest.mark.parametrize("key", [None, "", "EMPTY_TOKEN", "tml-unknown"])
def test_missing_malformed_or_unknown_keys_are_refused(tmp_path, key):
    with pytest.raises(Unauthorized):
        authenticate(SQLiteStore(tmp_path / "s.db"), key)


@pytest.mark.parametrize(
    "name", ["../x", "..", ".hidden", "a/b", "/abs", "a\\b", "", "x" * 129, "a..b", 3, None]
)
def test_bad_checkpoint_names_are_refused(name):
    with pytest.raises(BadRequest):
        check_name(name)


def test_good_names_and_uris_round_trip():
    assert check_name("epoch-1.final_v2") == "epoch-1.final_v2"
    uri = parse_uri("twinkle://sess-ab:train:0/weights/step-3")
    assert (uri.run_id, uri.kind, uri.name) == ("sess-ab:train:0", "weights", "step-3")
    assert str(uri) == "twinkle://sess-ab:train:0/weights/step-3"
    assert parse_uri("tinker://sess-ab:train:0/weights/s").run_id == "sess-ab:train:0"


@pytest.mark.parametrize(
    "uri",
    [
        "/etc/passwd",
        "file:///tmp/x",
        "twinkle://run/weights/../../x",
        "twinkle://../weights/x",
        "twinkle://run/other/x",
        "twinkle://run/weights/a/b",
        "twinkle://run/weights",
    ],
)
def test_uris_that_name_directories_are_refused(uri):
    with pytest.raises(BadRequest):
        parse_uri(uri)
