"""A Hugging Face reference engine in TensorRT-LLM's place: paged KV pool, SemBlend connector, prefill runner."""
