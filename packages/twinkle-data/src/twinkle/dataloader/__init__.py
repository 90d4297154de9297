"""DataLoader that slices batches by data rank and resumes from a consumed-sample count."""
