"""twinkle_client imports no torch, transformers or peft: it must run on a bare laptop."""

import subprocess
import sys

PROBE = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'torch', 'transformers', 'peft', 'datasets', 'fastapi'}:
            raise ImportError(f'{name} is blocked: the client must not need it')
        return None

sys.meta_path.insert(0, Block())
import twinkle_client
from twinkle_client import TwinkleClient, init_twinkle_client
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import Dataset, DatasetMeta
from twinkle_client.manager import TwinkleClient
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler
print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', 'peft'}))
"""


def test_every_client_module_imports_with_torch_blocked():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
