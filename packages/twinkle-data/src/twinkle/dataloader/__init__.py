"""DataLoader that slices batches by data rank and resumes from a consumed-sample count."""

from twinkle.dataloader.loader import DEFAULT_SEED, DataLoader

__all__ = ["DEFAULT_SEED", "DataLoader"]
