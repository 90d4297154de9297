"""The documents' server.py: the multi-tenant HTTP service on Ray Serve, on a CPU machine.

    python cookbook/server/server.py [-c config.yaml] [--host 127.0.0.1] [--port 8000]

``twinkle.initialize(mode='http', groups=...)`` joins the Ray cluster (or starts a local
one) and checks that it can hold the groups: a 'model' group for the base model and its
pool of LoRA slots, a 'sampler' group for the sampler. ``twinkle.server.launch`` then
deploys the service as a Ray Serve ingress whose one replica builds the model and the
sampler on their groups, and serves until Ctrl-C. Without ``-c`` it serves the bundled
tiny model on CPU, with state under $TWINKLE_HOME (default ~/.twinkle). On GPUs, pass a
config naming the model (``model: {model_id: ..., device: cuda}``, ``sampler: {kind:
vllm}``); ``TWINKLE_RANKS`` sets the workers per group (default 1).

Issue a key with the same config (``twinkle-server keys create --name alice``), then train
from a laptop with cookbook/client/twinkle/sft.py or grpo.py.
"""

import argparse
import os

import twinkle
import twinkle.server
from twinkle import DeviceGroup, Platform

RANKS = int(os.environ.get("TWINKLE_RANKS", "1"))
DEVICE = Platform.detect_device_type()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default=None, help="server YAML (default: bundled)")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args()

    device_groups = [
        DeviceGroup(name="model", ranks=RANKS, device_type=DEVICE),
        DeviceGroup(name="sampler", ranks=RANKS, device_type=DEVICE),
    ]
    # The dashboard costs a local cluster about 1 GiB; drop the option to get it.
    twinkle.initialize(
        mode="http", groups=device_groups, ray_init_kwargs={"include_dashboard": False}
    )

    # Model cluster, Sampler cluster and the ingress (the Utility side: sessions, keys,
    # runs, checkpoints, datasets) start here.
    twinkle.server.launch(args.config, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
