"""Model code shared by rollout and training: loading a causal LM and its tokenizer (``loading``, LoRA
checkpoint directories in ``adapters``), the lean Llama/Qwen2 forward and its rotary helpers
(``lean_llama``), and the dtype the numerics run in (``precision``)."""
