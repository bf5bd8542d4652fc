"""Tiny random models and GGUF files for fast tests."""

from __future__ import annotations

from pathlib import Path

import mlotspark  # noqa: F401
import mlx.core as mx
import numpy as np

from mlotspark.models.execution import Runner, prepare
from mlotspark.models.llama import Model, ModelArgs

TINY = dict(
    model_type="llama",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rope_traditional=True,
    tie_word_embeddings=True,
)


def tiny_model(seed: int = 0, execution: str | None = None, **overrides) -> Model:
    """A random llama-family model with TINY's shapes (float32), prepared as the loader
    prepares a model: the device's runner, or ``execution`` (cpu | gpu | plain). Calling the
    model runs it plainly; ``tiny_runner`` gives the runner too."""
    return tiny_runner(seed, execution, **overrides).model


def tiny_runner(seed: int = 0, execution: str | None = None, **overrides) -> Runner:
    """``tiny_model``'s runner (``runner.model`` is the model): what the runtime calls."""
    mx.random.seed(seed)
    model = Model(ModelArgs.from_dict({**TINY, **overrides}))
    mx.eval(model.parameters())
    return prepare(model, execution)



def prefilled(model, prompt, cache: list, chunk: int = 512) -> list:
    """``cache`` with every token of ``prompt`` but the last run into it, and the caches'
    ``prepare_decode``, as the runtime does before a request's own loop (``runtime/prefill.py``)."""
    from mlotspark.options import GenerationOptions
    from mlotspark.runtime.generation import Generation
    from mlotspark.runtime.prefill import prefill_prompt

    gen = Generation(model, None, mx.array(prompt).tolist(), cache, GenerationOptions(prefill_chunk=chunk))
    prefill_prompt(gen.model, gen)
    return cache


def greedy(model, cache, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens after ``prompt`` and the logits (steps, V) of each one-token step."""
    logits = model(mx.array([prompt]), cache)
    toks, out = [], []
    for _ in range(steps):
        tok = mx.argmax(logits[:, -1, :], axis=-1)
        toks.append(tok.item())
        logits = model(tok[None], cache)
        out.append(logits[0, -1])
    return toks, np.array(mx.stack(out))

def _byte_tokens() -> list[str]:
    # GPT-2's printable stand-ins for the 256 bytes, as byte-level BPE vocabularies use.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, (chr(c) for c in cs)))
    return [table[b] for b in range(256)]


_NAMES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def write_tiny_gguf(path: Path, model: Model, chat_template: str | None = None) -> Path:
    """Save ``model`` (TINY shapes) as a GGUF llama file with a byte-level vocabulary
    (and ``chat_template`` instead of the plain ChatML one when given)."""
    from mlx.utils import tree_flatten

    arrays = {}
    for name, w in tree_flatten(model.parameters()):
        parts = name.split(".")
        if name == "model.embed_tokens.weight":
            arrays["token_embd.weight"] = w
        elif name == "model.norm.weight":
            arrays["output_norm.weight"] = w
        else:  # model.layers.N.<self_attn|mlp>.<proj>.weight or model.layers.N.<norm>.weight
            layer = parts[2]
            key = parts[-2]
            arrays[f"blk.{layer}.{_NAMES[key]}.weight"] = w
    a = model.args
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + _byte_tokens()
    tokens += [f"<unused{i}>" for i in range(a.vocab_size - len(tokens))]
    types = [3] * 3 + [1] * 256 + [1] * (a.vocab_size - 259)
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    meta = {
        "general.architecture": "llama",
        "general.name": "tiny",
        "llama.embedding_length": u32(a.hidden_size),
        "llama.block_count": u32(a.num_hidden_layers),
        "llama.feed_forward_length": u32(a.intermediate_size),
        "llama.attention.head_count": u32(a.num_attention_heads),
        "llama.attention.head_count_kv": u32(a.num_key_value_heads),
        "llama.attention.layer_norm_rms_epsilon": mx.array(a.rms_norm_eps, dtype=mx.float32),
        "llama.rope.freq_base": mx.array(a.rope_theta, dtype=mx.float32),
        "llama.context_length": u32(a.max_position_embeddings),
        "llama.vocab_size": u32(a.vocab_size),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(np.array(types, dtype=np.int32)),
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.ggml.bos_token_id": u32(1),
        "tokenizer.chat_template": chat_template or (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    }
    mx.save_gguf(str(path), arrays, meta)
    return Path(path)


def chain_model(chain: list[int], vocab_size: int, seed: int = 0) -> Model:
    """A tiny llama (TINY's shapes, ``vocab_size`` wide) whose greedy next token after
    ``chain[i]`` is ``chain[i + 1]``: its attention and MLP write nothing, so the last hidden
    state is the input token's own embedding, and the output layer's row for ``chain[i + 1]``
    is ``chain[i]``'s embedding. A scripted reply on a real vocabulary, to drive the engine's
    text path (tags, splitting) without weights; the tokens before the last must differ.
    """
    if len(set(chain[:-1])) != len(chain) - 1:
        raise ValueError("a chain's tokens (but the last) must all differ")
    mx.random.seed(seed)
    model = Model(ModelArgs.from_dict({**TINY, "vocab_size": vocab_size, "tie_word_embeddings": False}))
    for layer in model.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    emb = np.array(model.model.embed_tokens.weight)
    head = np.zeros_like(emb)
    for prev, nxt in zip(chain, chain[1:]):
        head[nxt] = emb[prev] / np.linalg.norm(emb[prev]) * 10.0
    model.lm_head.weight = mx.array(head)
    mx.eval(model.parameters())
    return model
