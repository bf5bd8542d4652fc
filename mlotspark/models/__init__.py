"""Model definitions. ``llama`` is ours (llama, mistral, qwen2, qwen3, GGUF llama);
other architectures are loaded through mlx-lm's own classes (see ``loader``)."""
