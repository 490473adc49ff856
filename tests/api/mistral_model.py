"""A real mlx-lm model folder with Mistral's tokenizer layout and a chat template in one of Mistral's
tool formats.

The templates in ``tests/api/mistral_templates/`` are written for these tests, in the formats of
Mistral's published templates (mistral-common's ``v3_spm``, ``v3`` and ``v11`` chat templates, as
in its models' tokenizer configs), with the rules the service must meet: tools in
``[AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]`` before the last ``[INST]``, and every tool call id 9
characters long (any other id raises, as Mistral's own templates do):

* ``mistral-v3``: tokenizer v3 on SentencePiece (Mistral-7B-Instruct-v0.3): calls
  ``[TOOL_CALLS] [{"name", "arguments", "id"}]``, results
  ``[TOOL_RESULTS] {"content", "call_id"}[/TOOL_RESULTS]``;
* ``mistral-v3-tekken``: the same on Tekken (Mistral-Nemo-Instruct-2407), no space after the
  control tokens (``[TOOL_CALLS][``);
* ``mistral-v11``: tokenizer v11 (Mistral Small 3.2, Magistral): calls
  ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` in history, ``[TOOL_CALLS]name[ARGS]{...}`` as a
  model writes them, results ``[TOOL_RESULTS]id[TOOL_CONTENT]...[/TOOL_RESULTS]``.

The tokenizer is laid out as Mistral 7B v0.3's ``tokenizer.json``: a BPE over SentencePiece's "▁"
(no byte-level alphabet), ``<unk> <s> </s> [INST] [/INST] [TOOL_CALLS] [AVAILABLE_TOOLS]
[/AVAILABLE_TOOLS] [TOOL_RESULTS] [/TOOL_RESULTS]`` as special tokens 0 to 9 (their ids in v0.3) and
v11's ``[SYSTEM_PROMPT] [/SYSTEM_PROMPT] [TOOL_CONTENT] [ARGS] [CALL_ID]`` after them, so
mlx-lm reads it with its SentencePiece detokenizer and llguidance with the control tokens as
single tokens. The vocabulary is trained on the demo model's corpus; the weights are random.
"""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATES = Path(__file__).with_name("mistral_templates")
V03, NEMO, V11 = "mistral-v3", "mistral-v3-tekken", "mistral-v11"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                  "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                  "[TOOL_CONTENT]", "[ARGS]", "[CALL_ID]"]
TOOL_CALLS_ID = SPECIAL_TOKENS.index("[TOOL_CALLS]")


def chat_template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def build_mistral_model(out: Path, template: str, vocab_size: int = 2000) -> Path:
    """Write the model folder (tokenizer, ``template`` as its chat template, random weights) to ``out``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from demo_model.builder import CORPUS_PATH, ModelSpec, model_config

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(CORPUS_PATH.read_text(encoding="utf-8").splitlines(keepends=True), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf.save_pretrained(str(out))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(tokenizer_class="LlamaTokenizerFast", chat_template=template)
    config_path.write_text(json.dumps(config, indent=2))
    _save_weights(out, model_config(ModelSpec(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128,
                                              vocab=tok.get_vocab_size(), context=2048),
                                    {"<|bos|>": 1, "<|eos|>": 2, "<|im_end|>": 2, "<|pad|>": 0}))
    return out


def _save_weights(out: Path, config: dict) -> None:
    from engine_worker.runner.mlx_core import mx

    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    config = {**config, "eos_token_id": 2, "torch_dtype": "float32"}
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.model.embed_tokens.weight = model.model.embed_tokens.weight * 0.02
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(config, out / "config.json")
