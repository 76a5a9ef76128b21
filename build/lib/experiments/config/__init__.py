"""The harness's configuration: Hydra's typed schema, its validation, and a job's settings, all before torch loads."""
