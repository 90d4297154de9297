"""MultiTurnRollout around vLLMSampler on one CUDA GPU: the check a CPU cannot make.

The CPU tests run the rollout with TorchSampler (``packages/twinkle-rl/tests/test_rollout.py``:
the model's own logprobs of a rollout's sequence are the sampler's) and with the Twinkle
client's sampler against a server (``packages/twinkle-kit/tests/test_client_rl_inputs_e2e.py``).
Here the bundled tiny model's weights are synced into a vLLMSampler, 4 tasks x 4
trajectories run up to 3 turns (every turn calls the calculator; stop strings keep turns
short and ending), then the trainer scores the sequences: ``policy/logp_mismatch`` (the
mean absolute difference of the trainer's and vLLM's logprobs of the sampled tokens) must
stay under ``--tolerance``, and the sequences must hold more than one turn. Then the same
batch trains with DecoupledPPOLoss, vLLM's logprobs as the behaviour policy and the
trainer's ``policy_logps`` as the proximal one: on fresh samples its importance weights
are the two's mismatch, so their mean must lie within ``--tolerance`` of 1.

    python benchmarks/gpu/check_agentic_vllm_gpu.py [--tolerance 0.02]

Refuses to run without a CUDA GPU and vLLM (the ``vllm`` extra). About a minute; step 8 of
``validate.py``. ``--sampler torch`` runs the same script with TorchSampler, on a CPU too:
the CPU test ``test_gpu_validation_scripts.py`` runs it so, everything but vLLM.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--sampler", choices=("vllm", "torch"), default="vllm")
    args = parser.parse_args(argv)
    if args.sampler == "vllm" and not torch.cuda.is_available():
        print("this check needs a CUDA GPU; the CPU tests cover the rest", file=sys.stderr)
        return 2

    from twinkle.checkpoint_engine import CheckpointEngineManager
    from twinkle.data_format import SamplingParams, ToolCall
    from twinkle.env import ArithmeticToolEnv, task_row
    from twinkle.model import TransformersModel
    from twinkle.rollout import MultiTurnRollout
    from twinkle.sampler import TorchSampler, vLLMSampler

    model_id = "bundled://tiny-qwen3"
    model = TransformersModel(model_id=model_id)
    model.set_template("Qwen3_5Template")
    model.set_loss("GRPOLoss")
    if args.sampler == "vllm":
        engine_args = {"gpu_memory_utilization": 0.2, "enforce_eager": True}  # no graph capture
        sampler = vLLMSampler(model_id, engine_args=engine_args)
    else:
        sampler = TorchSampler(model_id)
    sampler.set_template("Qwen3_5Template")
    CheckpointEngineManager(model=model, sampler=sampler).sync_weights(merge_and_sync=True)

    def calls_calculator(text: str) -> dict:
        call = ToolCall(name="calculator", arguments={"expression": "2 * 3"})
        return {"role": "assistant", "content": text, "tool_calls": [call.to_openai()]}

    params = SamplingParams(max_tokens=8, temperature=1.0, seed=0, stop=list("etaoins "))
    rollout = MultiTurnRollout(
        sampler,
        sampler.template,
        ArithmeticToolEnv,
        3,
        sampling_params=params,
        response_parser=calls_calculator,
    )
    trajectories = rollout([task_row(a, a + 1) for a in range(2, 6)], num_samples=4)
    turns = max(t.turns for t in trajectories)
    features = [t.input_feature() for t in trajectories]
    sampled = [t.sampled_logprobs() for t in trajectories]
    advantages = [0.0] * len(trajectories)
    model.forward_backward(inputs=features, old_logps=sampled, advantages=advantages)
    mismatch = model.calculate_metric(is_training=True)["policy/logp_mismatch"]
    model.set_loss("DecoupledPPOLoss")
    prox = model.policy_logps(features)
    model.forward_backward(
        inputs=features, old_logps=sampled, prox_logps=prox, advantages=advantages
    )
    weight = model.calculate_metric(is_training=True)["policy/is_weight_mean"]
    print(
        "| sampler | trajectories | most turns | logp mismatch (trainer vs sampler) | "
        "decoupled PPO weight mean |"
    )
    print("| --- | --- | --- | --- | --- |")
    print(f"| {args.sampler} | {len(trajectories)} | {turns} | {mismatch:.2e} | {weight:.4f} |")
    if turns < 2 or mismatch > args.tolerance or abs(weight - 1) > args.tolerance:
        print(
            f"FAILED: turns {turns}, mismatch {mismatch}, weight mean {weight} "
            f"(tolerance {args.tolerance})"
        )
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
