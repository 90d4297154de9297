"""The user's documents' data code, run as written with only the hub ids changed to the
bundled ones (004, "partial use of components", and the dataset parts of the guide)."""

import datasets
import numpy as np
import pytest

# 004, lines 65-93, with the indentation the scraped document lost restored and the ids
# changed; nothing else.
PARTIAL_USE = '''
from twinkle.dataset import PackingDataset, DatasetMeta
from twinkle.dataloader import DataLoader
from twinkle.preprocessor import SelfCognitionProcessor

def train():
    dataset_meta = DatasetMeta(
        dataset_id='ms://swift/self-cognition',
    )

    dataset = PackingDataset(dataset_meta)
    dataset.map(SelfCognitionProcessor(model_name='Twinkle模型', model_author='ModelScope社区'))
    dataset.set_template('Qwen3_5Template', model_id='ms://Qwen/Qwen3.5-4B', max_length=512)
    dataset.encode()
    dataset.pack_dataset()

    dataloader = DataLoader(dataset, batch_size=8)
    for data in dataloader:
        print(data)
        """
        {
            "input_ids": [...],
            "position_ids": [...],
            ...
        }
        """
        break

if __name__ == '__main__':
    train()
'''.replace("ms://swift/self-cognition", "bundled://self-cognition").replace(
    "ms://Qwen/Qwen3.5-4B", "bundled://tiny-qwen3"
)


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf")))
        yield


def test_partial_use_of_components_runs_and_prints_a_packed_batch(capsys):
    namespace = {"__name__": "__main__"}
    exec(compile(PARTIAL_USE, "004_partial_use.py", "exec"), namespace)
    printed = capsys.readouterr().out
    assert printed.startswith("[InputFeature(input_ids=array(")
    assert "position_ids=array(" in printed and "seq_lens=[" in printed


def test_partial_use_packs_every_self_cognition_row_into_rows_of_512():
    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta, PackingDataset
    from twinkle.preprocessor import SelfCognitionProcessor

    dataset = PackingDataset(DatasetMeta(dataset_id="bundled://self-cognition"))
    dataset.map(SelfCognitionProcessor(model_name="Twinkle模型", model_author="ModelScope社区"))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3", max_length=512)
    dataset.encode()
    dataset.pack_dataset()
    batches = list(DataLoader(dataset, batch_size=8))
    rows = [row for batch in batches for row in batch]
    assert len(rows) == len(dataset) and all(len(batch) <= 8 for batch in batches)
    assert all(row.length <= 512 for row in rows)
    source = Dataset(DatasetMeta("bundled://self-cognition"))
    assert sum(len(row.seq_lens) for row in rows) == len(source)
    text = dataset.template.decode(np.concatenate([row.input_ids for row in rows]))
    assert "Twinkle模型" in text and "ModelScope社区" in text and "{{NAME}}" not in text


def test_the_self_cognition_pipeline_of_the_guide():
    # 004, lines 1351-1356: map and encode without the cache, then a DataLoader.
    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.preprocessor import SelfCognitionProcessor

    base_model = "bundled://tiny-qwen3"
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition", data_slice=range(500)))
    dataset.set_template("Qwen3_5Template", model_id=base_model, max_length=256)
    dataset.map(
        SelfCognitionProcessor("Twinkle Model", "ModelScope Team"), load_from_cache_file=False
    )
    dataset.encode(batched=True, load_from_cache_file=False)
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    batch = next(iter(dataloader))
    assert len(batch) == 8
    assert all((feature.labels != -100).any() for feature in batch)


def test_the_countdown_dataset_of_the_guide_feeds_its_reward():
    # 004, lines 517-524 and the reward's reading of user_data (lines 558-561).
    from twinkle.dataset import Dataset, DatasetMeta

    def create_countdown_dataset():
        dataset = Dataset(dataset_meta=DatasetMeta("bundled://countdown", data_slice=range(500)))
        dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3", max_length=8192)
        dataset.map("CountdownProcessor")
        dataset.encode(add_generation_prompt=True, batched=True)
        return dataset

    dataset = create_countdown_dataset()
    assert len(dataset) == 500
    for trajectory in (dataset[0], dataset[499]):
        user_data = trajectory.get("user_data", [{}])
        data = user_data[0] if isinstance(user_data, list) and user_data else {}
        assert isinstance(data.get("target"), int) and data["target"] > 0
        assert 3 <= len(data.get("nums", [])) <= 4
        assert trajectory.labels is None
        assert str(data["target"]) in trajectory.messages[-1].content
