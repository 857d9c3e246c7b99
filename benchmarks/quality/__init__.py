"""Quality of materialized KV on a real pretrained model (SmolLM2-135M-Instruct, CPU): see docs/quality.md."""
