"""Orchestrators are adapters over the same stage functions: KFP (local runner and compiled YAML), Airflow, k8s jobs."""
