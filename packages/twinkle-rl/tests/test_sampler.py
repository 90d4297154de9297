"""TorchSampler: what a SampleResponse holds, seeded reproducibility, stops, and agreement with
the trainer's logps and with transformers' own generate."""

import numpy as np
import pydantic
import pytest
import torch

from twinkle.data_format import SamplingParams
from twinkle.model import TransformersModel
from twinkle.sampler import TorchSampler

MODEL_ID = "bundled://tiny-qwen3"


def prompt(question: str, answer: str = "") -> dict:
    return {"messages": [{"role": "user", "content": question}], "user_data": [{"answer": answer}]}


PROMPTS = [prompt("What is 2 + 3?", "5"), prompt("Who are you, and who made you?")]


def tokens_of(responses):
    return [seq.tokens for r in responses for seq in r.sequences]


def test_each_prompt_gets_num_samples_sequences_with_matching_fields(sampler):
    params = SamplingParams(max_tokens=6, seed=0, logprobs=2)
    responses = sampler.sample(PROMPTS, params, num_samples=3)
    assert len(responses) == 2 and all(len(r.sequences) == 3 for r in responses)
    for response in responses:
        for seq in response.sequences:
            assert len(seq.tokens) == len(seq.logprobs) <= 6
            assert all(len(pairs) == 3 for pairs in seq.logprobs)  # sampled + top 2
            assert all(pairs[1][1] >= pairs[2][1] for pairs in seq.logprobs)
            assert seq.stop_reason in ("stop", "length")


def test_new_input_feature_labels_exactly_the_completion(sampler):
    encoded = sampler.template.encode(PROMPTS[0], add_generation_prompt=True)
    seq = sampler.sample([encoded], SamplingParams(max_tokens=5, seed=1))[0].sequences[0]
    feature = seq.new_input_feature
    n_prompt = len(encoded.input_ids)
    assert feature.input_ids.tolist() == encoded.input_ids.tolist() + seq.tokens
    assert feature.labels[:n_prompt].tolist() == [-100] * n_prompt
    assert feature.labels[n_prompt:].tolist() == seq.tokens
    assert feature.messages[-1].role == "assistant" and feature.messages[-1].content == seq.text
    assert feature.user_data == [{"answer": "5"}]


def test_a_seed_reproduces_and_another_seed_differs(sampler):
    a = sampler.sample(PROMPTS, SamplingParams(max_tokens=8, seed=7), num_samples=2)
    b = sampler.sample(PROMPTS, SamplingParams(max_tokens=8, seed=7), num_samples=2)
    c = sampler.sample(PROMPTS, SamplingParams(max_tokens=8, seed=8), num_samples=2)
    assert tokens_of(a) == tokens_of(b)
    assert tokens_of(a) != tokens_of(c)
    # The samples of one prompt differ from each other (each has its own generator).
    assert a[0].sequences[0].tokens != a[0].sequences[1].tokens


def test_unseeded_calls_differ_but_a_new_sampler_replays_them():
    first, second = TorchSampler(MODEL_ID, seed=3), TorchSampler(MODEL_ID, seed=3)
    for s in (first, second):
        s.set_template("Qwen3_5Template")
    params = SamplingParams(max_tokens=8)
    run_a = [tokens_of(first.sample(PROMPTS, params)) for _ in range(2)]
    run_b = [tokens_of(second.sample(PROMPTS, params)) for _ in range(2)]
    assert run_a == run_b and run_a[0] != run_a[1]


def test_a_rows_sample_does_not_depend_on_its_batch_mates(sampler):
    params = SamplingParams(max_tokens=8, seed=11)
    together = sampler.sample(PROMPTS, params)
    alone = sampler.sample(PROMPTS[:1], params)
    assert together[0].sequences[0].tokens == alone[0].sequences[0].tokens


def test_logprobs_equal_the_trainers_at_the_label_tokens(sampler):
    """The off-by-one check: the sampler's logprob of completion token i must equal the
    trainer's logps at label position prompt_len + i (tolerance 1e-4, float32 on CPU)."""
    model = TransformersModel(model_id=MODEL_ID)
    responses = sampler.sample(PROMPTS, SamplingParams(max_tokens=10, seed=2), num_samples=2)
    for seq in [s for r in responses for s in r.sequences]:
        feature = seq.new_input_feature
        trainer = model.forward_only(inputs=[feature]).logps[0]
        at_labels = trainer[torch.as_tensor(feature.labels) != -100]
        sampled = torch.tensor([pairs[0][1] for pairs in seq.logprobs])
        torch.testing.assert_close(at_labels.float(), sampled, atol=1e-4, rtol=0)


def test_prompt_logprobs_equal_the_trainers(sampler):
    encoded = sampler.template.encode(PROMPTS[1], add_generation_prompt=True)
    response = sampler.sample([encoded], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    model = TransformersModel(model_id=MODEL_ID)
    feature = dict(encoded)
    feature["labels"] = np.asarray(encoded.input_ids)
    trainer = model.forward_only(inputs=[feature]).logps[0][1:]
    assert response.prompt_logprobs[0] is None
    ours = torch.tensor([entry[0][1] for entry in response.prompt_logprobs[1:]])
    torch.testing.assert_close(trainer.float(), ours, atol=1e-4, rtol=0)


def test_greedy_equals_transformers_generate(sampler):
    encoded = sampler.template.encode(PROMPTS[0], add_generation_prompt=True)
    seq = sampler.sample([encoded], SamplingParams(max_tokens=12, temperature=0))[0].sequences[0]
    ids = torch.as_tensor(encoded.input_ids)[None]
    reference = sampler.model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=sorted(sampler._stop_token_ids(sampler.template)),
        pad_token_id=0,
    )[0, ids.shape[1] :].tolist()
    assert seq.tokens == reference


def test_top_k_one_is_greedy(sampler):
    greedy = sampler.sample(PROMPTS, SamplingParams(max_tokens=6, temperature=0))
    top1 = sampler.sample(PROMPTS, SamplingParams(max_tokens=6, top_k=1, seed=5))
    assert tokens_of(greedy) == tokens_of(top1)


def test_a_stop_token_ends_the_sequence_and_stays_in_its_tokens(sampler):
    free = sampler.sample(PROMPTS[:1], SamplingParams(max_tokens=8, seed=4))[0].sequences[0]
    stop_id = free.tokens[2]
    params = SamplingParams(max_tokens=8, seed=4, stop=[stop_id])
    seq = sampler.sample(PROMPTS[:1], params)[0].sequences[0]
    first = free.tokens.index(stop_id)
    assert seq.tokens == free.tokens[: first + 1] and seq.stop_reason == "stop"


def test_a_stop_string_ends_the_sequence_and_is_cut_from_the_text(sampler):
    free = sampler.sample(PROMPTS[:1], SamplingParams(max_tokens=10, seed=4))[0].sequences[0]
    piece = sampler.template.decode(free.tokens[3:4], skip_special_tokens=True).strip()
    assert piece, "pick a token with visible text"
    seq = sampler.sample(PROMPTS[:1], SamplingParams(max_tokens=10, seed=4, stop=piece))[0]
    seq = seq.sequences[0]
    assert seq.stop_reason == "stop" and len(seq.tokens) <= 4
    assert piece not in seq.text and free.text.startswith(seq.text)


def test_a_stop_string_that_never_occurs_runs_to_max_tokens(sampler):
    params = SamplingParams(max_tokens=7, seed=4, stop=["\u2603 never \u2603"])
    plain = sampler.sample(PROMPTS, SamplingParams(max_tokens=7, seed=4))
    stopped = sampler.sample(PROMPTS, params)
    assert tokens_of(stopped) == tokens_of(plain)
    assert all(
        s.stop_reason == ("length" if len(s.tokens) == 7 else "stop")
        for r in stopped
        for s in r.sequences
    )


def test_ignore_eos_samples_past_the_end_of_sequence_tokens(sampler, monkeypatch):
    free = sampler.sample(PROMPTS[:1], SamplingParams(max_tokens=8, seed=4))[0].sequences[0]
    # Make the second sampled token an end-of-sequence token: it ends the plain sample.
    monkeypatch.setattr(sampler, "_stop_token_ids", lambda template: {free.tokens[1]})
    ended = sampler.sample(PROMPTS[:1], SamplingParams(max_tokens=8, seed=4))[0].sequences[0]
    params = SamplingParams(max_tokens=8, seed=4, ignore_eos=True)
    ignored = sampler.sample(PROMPTS[:1], params)[0].sequences[0]
    assert ended.tokens == free.tokens[: free.tokens.index(free.tokens[1]) + 1]
    assert ended.stop_reason == "stop"
    assert ignored.tokens == free.tokens and ignored.stop_reason == free.stop_reason


def test_max_tokens_zero_is_refused_with_the_field_named(sampler):
    with pytest.raises(pydantic.ValidationError, match="max_tokens"):
        sampler.sample(PROMPTS, {"max_tokens": 0})


def test_a_dict_of_sampling_params_works_like_sampling_params(sampler):
    as_dict = sampler.sample(PROMPTS, {"max_tokens": 5, "seed": 9, "top_p": 0.9})
    as_params = sampler.sample(PROMPTS, SamplingParams(max_tokens=5, seed=9, top_p=0.9))
    assert tokens_of(as_dict) == tokens_of(as_params)


def test_trajectories_without_a_template_say_what_to_call():
    bare = TorchSampler(config=TorchSampler(MODEL_ID).model.config)
    with pytest.raises(ValueError, match="set_template"):
        bare.sample(PROMPTS, SamplingParams(max_tokens=2))


def test_an_empty_prompt_list_is_an_error(sampler):
    with pytest.raises(ValueError, match="no prompts"):
        sampler.sample([], SamplingParams(max_tokens=2))


def test_an_unknown_adapter_is_named(sampler):
    with pytest.raises(ValueError, match="no adapter 'ghost'"):
        sampler.sample(PROMPTS, SamplingParams(max_tokens=2), adapter_name="ghost")


def test_base_model_samples_without_the_loaded_adapters():
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    from twinkle.sampler import BASE_MODEL

    sampler = TorchSampler(MODEL_ID)  # its own: the shared one must stay adapter-free
    sampler.set_template("Qwen3_5Template")
    params = SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=0)
    before = sampler.sample(PROMPTS[:1], params)[0]
    donor = TransformersModel(MODEL_ID).model
    torch.manual_seed(1)
    lora = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    donor = get_peft_model(donor, lora)
    sampler.load_lora("tuned", lora.to_dict(), get_peft_model_state_dict(donor))
    tuned = sampler.sample(PROMPTS[:1], params)[0]  # None: the only adapter
    base = sampler.sample(PROMPTS[:1], params, adapter_name=BASE_MODEL)[0]
    assert base.prompt_logprobs == before.prompt_logprobs
    assert tuned.prompt_logprobs != before.prompt_logprobs
    with pytest.raises(ValueError, match="base model"):
        sampler.load_lora(BASE_MODEL, lora.to_dict(), {})


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, [0.5, 0.3, 0.2, 0.0]),
        ({"temperature": 0.5}, [25 / 38, 9 / 38, 4 / 38, 0.0]),  # p^2, renormalised
        ({"top_p": 0.6}, [0.625, 0.375, 0.0, 0.0]),  # 0.5 + 0.3 cover 0.6
        ({"top_k": 2}, [0.625, 0.375, 0.0, 0.0]),
    ],
)
def test_draws_follow_the_filtered_distribution(kwargs, expected):
    """4,000 single-row draws, each with its own seeded generator: frequencies within 0.03
    of the target (about four standard errors)."""
    from twinkle.sampler.decoding import _pick

    logits = torch.tensor([[0.5, 0.3, 0.2, 0.0]]).log()
    params = SamplingParams(max_tokens=1, **kwargs)
    counts = torch.zeros(4)
    for seed in range(4000):
        counts[_pick(logits, params, [torch.Generator().manual_seed(seed)])] += 1
    torch.testing.assert_close(counts / 4000, torch.tensor(expected), atol=0.03, rtol=0)


def test_stop_ids_shared_by_the_samplers_are_eos_and_end_of_turn(sampler):
    """The base set vLLMSampler sends as stop_token_ids; TorchSampler adds its model's own."""
    from twinkle.sampler import Sampler

    template = sampler._template()
    tokenizer = template.tokenizer
    shared = Sampler._stop_token_ids(sampler, template)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in shared
    assert tokenizer.unk_token_id not in shared
    assert shared <= sampler._stop_token_ids(template)


def test_on_token_hears_each_rows_tokens_in_order_across_chunks_and_calls():
    from twinkle.sampler.base import SampleRequest

    chunked = TorchSampler(MODEL_ID, device="cpu", max_batch_size=3)
    heard: dict[tuple[str, int], list] = {}

    def listener(name):
        return lambda row, token, pairs: heard.setdefault((name, row), []).append((token, pairs))

    params = SamplingParams(max_tokens=5, seed=4, logprobs=1)
    requests = [
        SampleRequest(PROMPTS, params, num_samples=2, on_token=listener("a")),
        SampleRequest(PROMPTS[:1], params, num_samples=1),  # no listener: shares the chunks
        SampleRequest(PROMPTS[1:], params, num_samples=2, on_token=listener("b")),
    ]
    outcomes = chunked.sample_many(requests)
    assert sorted(heard) == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 1)]
    for name, responses in (("a", outcomes[0]), ("b", outcomes[2])):
        for row, seq in enumerate(seq for r in responses for seq in r.sequences):
            assert [t for t, _ in heard[(name, row)]] == seq.tokens
            assert [p for _, p in heard[(name, row)]] == seq.logprobs
    assert TorchSampler.streams_tokens
