"""Sources a write job reads incrementally, by offsets that follow the checkpoint (Airflow-free)."""
