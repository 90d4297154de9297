"""Pipeline parallel on TransformersModel under torchrun on CPU (gloo) trains exactly like one
process: pp=2 (LoRA with GPipe, full with 1F1B), pp=2 × vpp=2 (interleaved 1F1B on a
four-layer model), pp=2 × dp=2 (FSDP2 inside each stage), pp=2 × tp=2 (the family's
tensor-parallel plan inside each stage) and the documents' pp=2 × tp=2 × dp=2 (both, on 8
processes: FSDP2 shards a stage's tp DTensors): three steps give the same losses, metrics
and weights. Plus checkpoints on pp and pp × tp (one gathered HF / peft folder that loads in
one process; a resume on the same mesh continues bit for bit; on another mesh the optimizer
state is refused naming both meshes, the weights alone load), the bad sizes refused at
setup, and the cookbook's pipeline example (cookbook/torchrun/pp.py on pp=2 × tp=2).

Tolerances, float32: losses rel 1e-6, weights abs 1e-5 (only the summation order differs:
micro-batches, padded rows against the single process's packed ones). Under tp the matmuls
are cut over the ranks too and AdamW turns that noise into more: full training measured
weights 1.4e-6 and 1.5e-6 apart, losses rel 1.5e-7 and the grad norm rel 1.2e-5, bounded at
2e-5, 2e-6 and 2e-4; a q/k norm whose gradient misses the other tp rank's heads moves its
weights by about the learning rate (1e-3) and tokens counted on both tp ranks double the
grad norm.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from twinkle import DeviceMesh
from twinkle.hub import resolve_model
from twinkle.model import TransformersModel
from twinkle.model.families.base import DECODER_LAYOUT
from twinkle.model.transformers.strategy.pipeline import PipelineConfig, stage_costs
from twinkle.model.transformers.strategy.pipeline_split import stage_layers

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_train.py"
PROCESSES = {"pp": 2, "pp_dp": 4, "pp_tp": 4, "pp_tp_dp": 8}
TP_BOUNDS = {"loss_rel": 2e-6, "atol": 2e-5, "norm_rel": 2e-4}


def load_script():
    spec = importlib.util.spec_from_file_location("pipeline_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> dict:
    """The same functions in this one process, without a mesh."""
    script = load_script()
    return {
        "lora": script.train("lora", None),
        "full": script.train("full", None),
        "vpp": script.train("full", None, config=script.four_layers()),
    }


def assert_close_tensors(got: dict, expected: dict, *, atol: float = 0):
    assert set(got) == set(expected) and expected
    for name, tensor in expected.items():
        diff = float((got[name] - tensor).abs().max())
        assert diff <= atol, f"{name}: differs by {diff:.3g} (bound {atol:.3g})"


def check_run(
    got: dict, expected: dict, *, loss_rel: float = 1e-6, atol: float = 1e-5, norm_rel=1e-4
) -> None:
    assert got["losses"] == pytest.approx(expected["losses"], rel=loss_rel)
    assert_close_tensors(got["weights"], expected["weights"], atol=atol)
    last, expected_last = got["metrics"][-1], expected["metrics"][-1]
    assert last["tokens"] == expected_last["tokens"]
    assert last["token_accuracy"] == pytest.approx(expected_last["token_accuracy"], abs=1e-9)
    assert last["grad_norm"] == pytest.approx(expected_last["grad_norm"], rel=norm_rel)
    assert got["eval_loss"] == pytest.approx(expected["eval_loss"], rel=loss_rel)
    if "tied_diff" in got:  # full training moved the tied embedding; both copies alike
        assert got["tied_diff"] == 0


@pytest.fixture(scope="module")
def folder_of(launch_per_size):
    return launch_per_size(SCRIPT, PROCESSES)


@pytest.mark.parametrize("case", list(PROCESSES))
def test_pipeline_trains_like_one_process(case, reference, folder_of):
    result = torch.load(folder_of(case) / f"{case}.pt", weights_only=False)
    for kind in ("lora", "full"):
        check_run(result[kind], reference[kind], **(TP_BOUNDS if "tp" in case else {}))
    if case == "pp":
        check_run(result["vpp"], reference["vpp"])
        check_errors(result["errors"])
    if case in ("pp", "pp_tp"):
        check_checkpoints(result["resume"])
    if case == "pp_tp":
        check_another_mesh(result["other_mesh"])


def check_errors(errors: dict) -> None:
    assert "micro_batch_size=3 must divide the 4 rows" in errors["micro_batch_size"]
    assert "5 micro-batches are not a multiple of 2 rounds" in errors["rounds"]
    for call in ("forward", "calculate_loss"):
        assert f"{call} does not run under pipeline parallel" in errors[call]


def check_checkpoints(resume: dict) -> None:
    # Same mesh: the resumed run continues exactly where the saved one went on.
    assert resume["resumed"] == resume["uninterrupted"]
    assert_close_tensors(resume["weights_resumed"], resume["weights_uninterrupted"])
    assert resume["progress"] == {"consumed_train_samples": 8, "step": 1}
    # The full model's folder, gathered from both stages, is a plain HF folder ...
    plain = AutoModelForCausalLM.from_pretrained(resume["full_path"]).state_dict()
    full = resume["full_weights"]
    assert_close_tensors({k: plain[k] for k in full}, full)
    # ... that loads back into the pipelined model (every stage its own layers).
    assert_close_tensors(resume["full_reloaded"], full)
    # The adapter folder is one peft folder, loadable in one process.
    lora = TransformersModel("bundled://tiny-qwen3", device="cpu")
    lora.add_adapter_to_model("default", resume["adapter_path"])
    params = dict(lora.model.named_parameters())
    step1 = resume["weights_step1"]
    assert_close_tensors({k: params[k].detach() for k in step1}, step1)


def check_another_mesh(other: dict) -> None:
    """pp=2 × tp=2's checkpoint on pp=2 × dp=2: the optimizer refused, naming both meshes;
    with resume_only_model the gathered adapter loads into the other layout unchanged."""
    assert "sharded on the mesh pp=2 × tp=2, and this run's mesh is pp=2 × dp=2" in (
        other["refusal"] or ""
    )
    assert "resume_only_model=True" in other["refusal"]
    assert other["weights_diff"] == 0


def test_split_balances_parameters_and_honours_an_explicit_split():
    # A heavy embedding: the first stage takes fewer layers.
    assert stage_layers([10] * 6, 2, None, first_extra=40) == [range(0, 1), range(1, 6)]
    assert stage_layers([10] * 6, 3, None) == [range(0, 2), range(2, 4), range(4, 6)]
    assert stage_layers([10] * 4, 2, None, split=[1, 3]) == [range(0, 1), range(1, 4)]
    assert stage_layers([10] * 8, 2, 2) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]


def test_the_split_counts_a_tied_head_on_the_last_stage():
    """The last stage holds a copy of a tied embedding as its head: it weighs as much there
    as on the first stage, so 8 equal layers split 4/4, not 3/5."""
    config = AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))
    config.num_hidden_layers, config.layer_types = 8, ["full_attention"] * 8
    base = AutoModelForCausalLM.from_config(config)
    assert base.lm_head.weight is base.model.embed_tokens.weight
    sizes, first, last = stage_costs(base, DECODER_LAYOUT)
    assert first == config.vocab_size * config.hidden_size
    assert last == first + config.hidden_size  # the head's copy and the final norm
    stages = stage_layers(sizes, 2, None, first_extra=first, last_extra=last)
    assert stages == [range(0, 4), range(4, 8)]


@pytest.mark.parametrize(
    ("sizes", "split", "message"),
    [
        ({"pp_size": 4}, None, "pp_size=4 is larger than the model's 2 decoder layers"),
        ({"pp_size": 2, "vpp_size": 2}, None, "vpp_size=2 does not divide the 1 layers per"),
        ({"pp_size": 2}, (2, 1), "split=[2, 1] holds 3 layers but the model has 2"),
    ],
)
def test_bad_sizes_are_refused_at_setup(sizes, split, message):
    mesh = DeviceMesh.from_sizes(**sizes, device_type="cpu")
    model = TransformersModel(
        "bundled://tiny-qwen3",
        device="cpu",
        device_mesh=mesh,
        pipeline_parallel=PipelineConfig(split=split),
    )
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        model.set_optimizer("AdamW")


def test_family_without_a_layout_and_unknown_schedule_are_refused():
    mesh = DeviceMesh.from_sizes(pp_size=2, device_type="cpu")
    moe = TransformersModel("bundled://tiny-qwen3-moe", device="cpu", device_mesh=mesh)
    with pytest.raises(ValueError, match="no pipeline layout for 'qwen3_moe'.*llama, qwen2, qwen3"):
        moe.set_optimizer("AdamW")
    model = TransformersModel(
        "bundled://tiny-qwen3",
        device="cpu",
        device_mesh=mesh,
        pipeline_parallel=PipelineConfig(schedule="Interleaved1F1B"),
    )
    with pytest.raises(ValueError, match="does not run one stage per rank.*GPipe, 1F1B"):
        model.set_optimizer("AdamW")


def test_the_pipeline_cookbook_example_trains_and_saves_one_adapter(tmp_path, torchrun):
    """cookbook/torchrun/pp.py on four processes, the documents' mesh at pp=2 × tp=2: LoRA
    with 1F1B, one peft folder gathered from both stages and both tp shards that loads in one
    process."""
    script = Path(__file__).resolve().parents[3] / "cookbook" / "torchrun" / "pp.py"
    done = torchrun(script, env={"TWINKLE_MAX_STEPS": "2"}, cwd=tmp_path, procs=4)
    loss = re.search(r"step 0 of 13, metric: \{'loss': ([0-9.]+)", done.stderr)
    assert loss is not None, done.stderr[-3000:]
    assert 7.0 < float(loss.group(1)) < 9.0
    folder = tmp_path / "output" / "last-checkpoint"
    saved = load_file(folder / "adapter_model.safetensors")
    assert {int(k.split(".layers.")[1].split(".")[0]) for k in saved} == {0, 1}
    model = TransformersModel("bundled://tiny-qwen3", device="cpu")
    model.add_adapter_to_model("default", str(folder))
    params = dict(model.model.named_parameters())
    for key, tensor in saved.items():
        name = key.replace(".weight", ".default.weight")
        assert torch.equal(params[name].detach(), tensor), name
