"""The remote API: which methods of which components a client may call, with their parameters.

The server derives the same table from its local components (``GET /api/v1/twinkle/api``,
built by ``twinkle.server.remote_api``); the proxies in this package implement exactly these
methods with these parameters. Tests check all three agree, so neither side can drift.
``**`` stands for the component's catch-all keyword arguments. ``CLIENT_EXTRAS`` lists
the parameters a proxy adds because the call crosses the network.
"""

from __future__ import annotations

REMOTE_API: dict[str, dict[str, list[str]]] = {
    "model": {
        "add_adapter_to_model": ["adapter_name", "config_or_path", "gradient_accumulation_steps"],
        "set_loss": ["loss", "**"],
        "set_optimizer": ["optimizer_cls", "**"],
        "set_lr_scheduler": ["scheduler_cls", "**"],
        "set_template": ["template", "**"],
        "set_processor": ["processor", "**"],
        "forward_backward": ["inputs", "micro_batch_size", "task", "**"],
        "forward_only": ["inputs", "task", "**"],
        "clip_grad_norm": ["max_norm"],
        "step": [],
        "zero_grad": [],
        "lr_step": [],
        "clip_grad_and_step": ["max_grad_norm", "gradient_accumulation_steps"],
        "calculate_metric": ["is_training"],
        "get_train_configs": [],
        "save": ["name", "save_optimizer", "consumed_train_samples", "overwrite"],
        "load": ["path", "load_optimizer"],
        "resume_from_checkpoint": ["path", "resume_only_model"],
    },
    "sampler": {
        "sample": ["inputs", "sampling_params", "num_samples"],
        "set_template": ["template", "**"],
    },
    "dataset": {
        "set_template": ["template", "**"],
        "map": [
            "preprocessor",
            "init_args",
            "batched",
            "num_proc",
            "load_from_cache_file",
            "on_error",
        ],
        "encode": [
            "batched",
            "add_generation_prompt",
            "num_proc",
            "load_from_cache_file",
            "on_error",
        ],
    },
    "dataloader": {
        "get_state": [],
        "resume_from_checkpoint": ["consumed_train_samples"],
    },
}

CLIENT_EXTRAS: dict[str, list[str]] = {
    "sampler.sample": ["adapter_uri"],
}
