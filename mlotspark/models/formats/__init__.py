"""Weight files: reading, checking and converting GGUF and safetensors, and the
converted files kept on disk beside a model.

- ``gguf``: a GGUF's model config from its metadata, its weight names mapped to ours
  (*how a GGUF tensor becomes an MLX weight*).
- ``gguf_check`` / ``safetensors_check``: a file's layout checked before any reader
  trusts it.
- ``gguf_convert``: GGUF types MLX cannot unpack (K-quants, IQ4, BF16), read with
  llama.cpp's ``gguf`` package and cached as float16 safetensors.
- ``weight_formats``: what precision each GGUF type runs at; re-quantization to MLX's
  affine format (``--weights``).
- ``float32_cache``: a GGUF's weights as the CPU runs them (float32), kept on disk.

``models.loader`` uses these. May import what ``models`` may, ``models.cpu.widen`` (the
float32 cache stores widened groups) and ``models.hub.wheel_pull`` (its progress bar).
"""
