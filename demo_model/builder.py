"""Build a small Llama-architecture model with a byte-level BPE tokenizer, fully offline.

The tokenizer is trained on ``corpus.txt`` (shipped in the repository) so token ids are identical
on every machine; the weights are random but deterministic for a given seed (the fast test model).
The result is a Hugging Face style folder that ``mlx_lm.load`` loads through its real path.
:mod:`demo_model.train` trains a model of this kind into the shipped demo model.

    python -m demo_model.builder OUT_DIR [--hidden 256 --layers 4 ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen 2.5 writes it; with ``tools``, Qwen's (Hermes') tool calling: the tools in the
# system message, calls as <tool_call> JSON </tool_call>, results as <tool_response> in a user turn.
# Messages without tools render exactly as plain ChatML. (transformers renders with trim_blocks: a
# newline right after a block tag is dropped, so those are written as {{ '\\n' }}.)
_TOOLS_SYSTEM = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n"
    "{% endif %}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
)
_TOOL_CALLS = (
    "<|im_start|>assistant\n{{ message['content'] or '' }}{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    "{% if not loop.first or message['content'] %}{{ '\\n' }}{% endif %}<tool_call>\n{\"name\": \"{{ fn['name'] }}\", "
    "\"arguments\": {{ fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
)
CHAT_TEMPLATE = (
    "{{ bos_token }}" + _TOOLS_SYSTEM + "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}" + _TOOL_CALLS +
    "{% elif message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message['content'] }}"
    "\n</tool_response><|im_end|>\n"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BUILD_MARKER = "build_spec.json"


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the model. The defaults give the ~3.5M-parameter test model."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 704
    vocab: int = 3000
    context: int = 4096
    dtype: str = "float32"
    seed: int = 0


def train_tokenizer(vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on the shipped corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS_PATH.read_text(encoding="utf-8").splitlines(keepends=True), trainer)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)]
    )
    return tok


def save_tokenizer(tok, out: Path, context: int) -> dict[str, int]:
    """Write ``tok`` in Hugging Face layout with the chat template; return the special tokens' ids."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.model_max_length = context
    hf.save_pretrained(str(out))
    # transformers 5 writes a class name 4.x does not know, and keeps the template in a side file.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}


def model_config(spec: ModelSpec, ids: dict[str, int]) -> dict:
    """The ``config.json`` of a Llama of shape ``spec``."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "intermediate_size": spec.intermediate,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": spec.vocab,
        "rope_theta": 10000.0,
        "max_position_embeddings": spec.context,
        "tie_word_embeddings": True,
        "torch_dtype": spec.dtype,
        "bos_token_id": ids["<|bos|>"],
        "eos_token_id": [ids["<|eos|>"], ids["<|im_end|>"]],
        "pad_token_id": ids["<|pad|>"],
    }


def build_model(out_dir: str | Path, spec: ModelSpec = ModelSpec()) -> Path:
    """Build the model into ``out_dir`` (atomically) and return its path."""
    from engine_worker.runner.mlx_core import mx

    from mlx.utils import tree_map
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    out = Path(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent if out.parent.exists() else None))
    try:
        tok = train_tokenizer(spec.vocab)
        ids = save_tokenizer(tok, tmp, spec.context)
        config = model_config(spec, ids)
        mx.random.seed(spec.seed)
        model = llama.Model(llama.ModelArgs.from_dict(config))
        # Small embeddings keep the tied output head's logits in a sane range for random weights.
        model.model.embed_tokens.weight = model.model.embed_tokens.weight * 0.02
        dtype = getattr(mx, spec.dtype)
        model.update(tree_map(lambda p: p.astype(dtype), model.parameters()))
        mx.eval(model.parameters())
        save_model(tmp, model)
        save_config(config, tmp / "config.json")
        (tmp / BUILD_MARKER).write_text(json.dumps(asdict(spec), indent=2))
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("built model %s at %s", spec, out)
    return out


def ensure_model(out_dir: str | Path, spec: ModelSpec = ModelSpec()) -> Path:
    """Return ``out_dir``, building the model first unless an identical build is already there."""
    out = Path(out_dir)
    marker = out / BUILD_MARKER
    if marker.exists() and json.loads(marker.read_text()) == asdict(spec) and _template_of(out) == CHAT_TEMPLATE:
        return out
    return build_model(out, spec)


def _template_of(out: Path) -> str | None:
    try:
        return json.loads((out / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    defaults = ModelSpec()
    for field, value in asdict(defaults).items():
        parser.add_argument(f"--{field}", type=type(value), default=value)
    parser.add_argument("--force", action="store_true", help="rebuild even if an identical build exists")
    args = parser.parse_args(argv)
    spec = ModelSpec(**{k: getattr(args, k) for k in asdict(defaults)})
    path = build_model(args.out, spec) if args.force else ensure_model(args.out, spec)
    print(path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
