"""Test and demo tooling that ships with the package (never imported by the core):
``stack`` runs a real Airflow deployment on loopback, ``guard`` ties each of its
processes to the life of the process that started it, ``checkpoints`` stages a checkpoint through
the core API for tests of the tasks after the write."""
