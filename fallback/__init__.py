"""PyAV fallback loader for files DALI cannot decode. Never imports DALI."""
