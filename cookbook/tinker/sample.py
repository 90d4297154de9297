"""Sample from a saved LoRA with the unmodified Tinker SDK, naming it by its twinkle:// path.

    twinkle-server keys create --name me
    twinkle-server launch &
    TWINKLE_SERVER_TOKEN=tml-... python cookbook/tinker/sft.py --epochs 2
    TWINKLE_SERVER_TOKEN=tml-... python cookbook/tinker/sample.py \
        --model-path twinkle://<run>/weights/twinkle-lora-1

The documents' TaaS inference example: ``init_tinker_client()`` comes before the SDK's
``ServiceClient`` import, and the sampling client is made from a ``twinkle://`` checkpoint
path, which the SDK alone would refuse (it checks for ``tinker://`` on the client);
``init_tinker_client`` lets every path-taking SDK call take that form. The prompt is
encoded and the answers decoded by Twinkle's Template on this machine. Only the ids
differ from the documents (bundled tiny model, local server).
"""

from __future__ import annotations

import argparse
import os

from tinker import types

from twinkle import init_tinker_client
from twinkle.data_format import Message, Trajectory
from twinkle.template import Template

# Step 1: Initialize Tinker client
init_tinker_client()

from tinker import ServiceClient  # noqa: E402  (after init_tinker_client, as documented)

BASE_MODEL = "bundled://tiny-qwen3"


def sample(model_path: str, base_url: str | None, max_tokens: int) -> list[str]:
    # Step 2: Connect to the server
    service_client = ServiceClient(base_url=base_url, api_key=os.environ.get("TINKER_API_KEY"))

    # Step 3: A sampling client on the saved LoRA, named by its twinkle:// path
    sampling_client = service_client.create_sampling_client(
        model_path=model_path, base_model=BASE_MODEL
    )

    # Step 4: The tokenizer runs here, in Twinkle's Template
    print(f"Using model {BASE_MODEL}")
    template = Template(model_id=BASE_MODEL)
    trajectory = Trajectory(
        messages=[
            Message(role="system", content="You are a helpful assistant"),
            Message(role="user", content="Who are you?"),
        ]
    )
    input_feature = template.batch_encode([trajectory], add_generation_prompt=True)[0]
    input_ids = input_feature["input_ids"].tolist()

    # Step 5: The prompt and the sampling parameters
    prompt = types.ModelInput.from_ints(input_ids)
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.7, stop=["\n"])

    # Step 6: Sample on the server
    print("Sampling...")
    result = sampling_client.sample(prompt=prompt, sampling_params=params, num_samples=1).result()

    # Step 7: Decode and print the answers
    print("Responses:")
    answers = [template.decode(seq.tokens) for seq in result.sequences]
    for i, answer in enumerate(answers):
        print(f"{i}: {answer!r}")
    return answers


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True, help="twinkle://<run>/weights/<name>")
    parser.add_argument("--base-url", default=None, help="default: $TWINKLE_SERVER_URL")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    sample(args.model_path, args.base_url, args.max_tokens)
