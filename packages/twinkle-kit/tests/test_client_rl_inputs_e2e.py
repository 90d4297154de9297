"""The documents' remote RL lines, as written, through the client against a real server.

* The Twinkle-client GRPO sample (user guide, remote training): completions from the server's
  sampler, read with ``seq.get('new_input_feature', seq)`` and ``seq.get('logprobs', [])``,
  then ``forward_backward(inputs=..., advantages=..., old_logps=old_logps_list)``. Its
  rewards would all be 0 on the random tiny model (the loop then skips training), so the
  advantages are given here.
* The run-modes page's HTTP sketch: ``forward_backward(inputs=responses, advantages=...)``
  with the sampler's result itself.

Only ids and sizes differ. The server's sampler and trainer start from the same weights and
a fresh LoRA adapter is the identity, so the sampler's logprobs match the trainer's.
"""

from __future__ import annotations

import pytest
from peft import LoraConfig

from twinkle_client import init_twinkle_client
from twinkle_client.errors import BadRequestError
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler

MODEL_ID = "bundled://tiny-qwen3"
NUM_GENERATIONS = 2
MAX_NEW_TOKENS = 6
LEARNING_RATE = 1e-5
TEMPERATURE = 1.0
PROMPTS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in (1, 2)]


@pytest.fixture(scope="module")
def client(server_process):
    server = server_process(
        "rl-inputs",
        {
            "model": {"model_id": MODEL_ID, "max_loras": 6, "device": "cpu"},
            "sampler": {"enabled": True, "kind": "torch"},
            "limits": {"max_loras_per_key": 6},  # one key holds every test's adapters
        },
    )
    key = server.cli("keys", "create", "--name", "rl")
    server.start(timeout_s=180)
    client = init_twinkle_client(base_url=server.url, api_key=key)
    yield client
    client.close()
    server.stop(timeout_s=30)


def grpo_model() -> MultiLoraTransformersModel:
    """The sample's model set-up, as written (gradient accumulation left at 1)."""
    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    lora_config = LoraConfig(
        target_modules="all-linear",
        r=8,
        lora_alpha=32,
        lora_dropout=0.05,
    )
    model.add_adapter_to_model("default", lora_config)
    model.set_loss("GRPOLoss", epsilon=0.2, beta=0.0)
    model.set_optimizer("AdamW", lr=LEARNING_RATE)
    model.set_processor("InputProcessor")
    model.set_template("Qwen3_5Template", model_id=MODEL_ID)
    return model


def sample_as_the_grpo_sample_does(model: MultiLoraTransformersModel):
    sampler = vLLMSampler(model_id=MODEL_ID)
    sampler.set_template("Qwen3_5Template", model_id=MODEL_ID)
    sampling_params = {
        "max_tokens": MAX_NEW_TOKENS,
        "temperature": TEMPERATURE,
        "top_p": 0.95,
    }
    twinkle_path = model.save(name="grpo-sampler-step-0", save_optimizer=False)
    current_adapter_uri = twinkle_path
    prompts = PROMPTS
    sample_response = sampler.sample(
        inputs=prompts,
        sampling_params=sampling_params,
        adapter_uri=current_adapter_uri,
        num_samples=NUM_GENERATIONS,
    )

    input_features = []
    old_logps_list = []
    completion_lengths = []

    sequences = sample_response.get("sequences", [])
    for seq in sequences:
        input_features.append(seq.get("new_input_feature", seq))
        old_logps_list.append(seq.get("logprobs", []))
        completion_lengths.append(len(seq.get("tokens", [])))
    return sequences, input_features, old_logps_list


def test_the_client_grpo_samples_old_logps_train_on_the_server(client):
    model = grpo_model()
    sequences, input_features, old_logps_list = sample_as_the_grpo_sample_does(model)
    assert len(sequences) == len(PROMPTS) * NUM_GENERATIONS
    advantages = [1.0, -1.0, 0.5, -0.5]

    output = model.forward_backward(
        inputs=input_features,
        advantages=advantages,
        old_logps=old_logps_list,
    )
    model.clip_grad_norm(1.0)
    model.step()
    model.zero_grad()
    model.lr_step()
    log_dict = {}
    log_dict.update(model.calculate_metric())
    assert log_dict["policy/logp_mismatch"] < 1e-4, log_dict  # each logprob at its token
    assert output.num_tokens == sum(len(seq.tokens) for seq in sequences)

    # The Ray samples' form of the same logprobs gives the same loss.
    ray_form = [[logprob[0][1] for logprob in sequence.logprobs] for sequence in sequences]
    other = grpo_model()
    again = other.forward_backward(inputs=input_features, advantages=advantages, old_logps=ray_form)
    assert again.loss == output.loss


def test_a_mismatched_old_logps_row_is_a_user_error_naming_it(client):
    model = grpo_model()
    _, input_features, old_logps_list = sample_as_the_grpo_sample_does(model)
    n = len(old_logps_list[1])
    old_logps_list[1] = old_logps_list[1][:-1]
    with pytest.raises(BadRequestError) as refused:
        model.forward_backward(
            inputs=input_features, advantages=[1.0] * 4, old_logps=old_logps_list
        )
    assert refused.value.status == 400 and refused.value.category == "user"
    assert f"old_logps[1] has {n - 1} values but row 1 of the batch has {n} label tokens" in str(
        refused.value
    )
    model.forward_backward(inputs=input_features, advantages=[1.0] * 4)  # the run still serves


def test_a_misspelt_loss_keyword_is_a_400_naming_the_closest_one(client):
    """``advantage=`` for ``advantages=`` would train without the advantages if ignored."""
    model = grpo_model()
    _, input_features, old_logps_list = sample_as_the_grpo_sample_does(model)
    with pytest.raises(BadRequestError) as refused:
        model.forward_backward(inputs=input_features, advantage=[1.0] * 4, old_logps=old_logps_list)
    assert refused.value.status == 400 and refused.value.category == "user"
    assert (
        "forward_backward got unknown keyword 'advantage' (did you mean 'advantages'?): nothing "
        "in the call reads it. The loss GRPOLoss accepts advantages (required), old_logps, "
        "ref_logps" in str(refused.value)
    )
    out = model.forward_backward(
        inputs=input_features, advantages=[1.0] * 4, old_logps=old_logps_list
    )
    assert out.loss is not None  # the run still serves


def test_the_http_sketch_trains_on_the_samplers_result(client):
    """``responses = sampler.sample(inputs=batch, sampling_params=params)`` then
    ``model.forward_backward(inputs=responses, advantages=advantages)``, as the page writes.

    The page sets no loss: under the default CrossEntropyLoss its advantages used to be
    dropped without a word. They are refused now, naming the losses that read them; with
    ``set_loss('GRPOLoss')`` the same line trains on them."""
    lora_config = LoraConfig(target_modules="all-linear", r=8, lora_alpha=32)
    # 配置模型
    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    model.add_adapter_to_model("default", lora_config)
    model.set_optimizer("AdamW", lr=1e-4)

    # 配置采样器
    sampler = vLLMSampler(model_id=MODEL_ID)
    batch, params, advantages = PROMPTS, {"max_tokens": MAX_NEW_TOKENS}, [1.0, -1.0]
    responses = sampler.sample(inputs=batch, sampling_params=params)
    with pytest.raises(BadRequestError) as refused:
        model.forward_backward(inputs=responses, advantages=advantages)
    assert refused.value.status == 400
    assert "CrossEntropyLoss accepts no keyword inputs" in str(refused.value)
    assert "'advantages' is read by " in str(refused.value) and "set_loss" in str(refused.value)
    model.set_loss("GRPOLoss")
    output = model.forward_backward(inputs=responses, advantages=advantages)
    model.step()

    lengths = [len(seq.tokens) for seq in responses["sequences"]]
    assert output.num_tokens == sum(lengths)
    # On-policy GRPO: minus the advantages weighted by each row's label tokens.
    want = -sum(a * n for a, n in zip(advantages, lengths, strict=True)) / sum(lengths)
    assert output.loss == pytest.approx(want, rel=1e-5)


def test_a_multi_turn_rollout_on_the_client_samples_and_trains_on_the_server(client):
    """Issue 18: MultiTurnRollout runs in the client's process (envs, template, token
    bookkeeping) around the server's sampler, and the server trains on its sequences: the
    trainer's logprobs of every sampled token are the sampler's, across turns."""
    from twinkle.data_format import SamplingParams, ToolCall
    from twinkle.env import ArithmeticToolEnv, task_row
    from twinkle.rollout import MultiTurnRollout
    from twinkle.template import Qwen3_5Template

    def calls_calculator(text):
        call = ToolCall(name="calculator", arguments={"expression": "2 * 3"})
        return {"role": "assistant", "content": text, "tool_calls": [call.to_openai()]}

    model = grpo_model()
    template = Qwen3_5Template(MODEL_ID)
    stop = list("etaoinsrhdlu0123456789 ")  # short turns that end (stop strings, <= 32)
    rollout = MultiTurnRollout(
        vLLMSampler(model_id=MODEL_ID),
        template,
        ArithmeticToolEnv,
        3,
        sampling_params=SamplingParams(max_tokens=4, temperature=1.0, seed=3, stop=stop),
        response_parser=calls_calculator,
        sample_kwargs={"adapter_uri": model.save(name="rollout-step-0", save_optimizer=False)},
    )
    trajectories = rollout([task_row(3, 4), task_row(5, 6)], num_samples=2)
    assert max(t.turns for t in trajectories) >= 2
    assert any(m.role == "tool" and m.content == "6" for t in trajectories for m in t.messages)
    model.forward_backward(
        inputs=[t.input_feature() for t in trajectories],
        advantages=[1.0, -1.0, 0.5, -0.5],
        old_logps=[t.sampled_logprobs() for t in trajectories],
    )
    assert model.calculate_metric()["policy/logp_mismatch"] < 1e-4
