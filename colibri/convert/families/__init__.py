"""One module per model family; each maps a Hugging Face config and checkpoint to colibri's format.

A family module has:
  describe(config, family) -> dict with "architecture", "hparams", "routing", "experts" (docs/FORMAT.md)
  plan(description, checkpoint) -> list of layout.Entry, in the file order FORMAT.md lists
"""

from . import deepseek, ernie, gpt_oss, granite, lfm2, llama4, mixtral, phimoe, qwen_moe

FAMILIES = {  # HF config "model_type" -> family module
    "mixtral": mixtral,
    "qwen3_moe": qwen_moe,
    "qwen2_moe": qwen_moe,
    "olmoe": qwen_moe,
    "granitemoe": granite,
    "granitemoeshared": granite,
    "glm4_moe": deepseek,
    "dots1": deepseek,
    "deepseek_v2": deepseek,
    "deepseek_v3": deepseek,
    "glm4_moe_lite": deepseek,
    "ernie4_5_moe": ernie,
    "gpt_oss": gpt_oss,
    "phimoe": phimoe,
    "llama4_text": llama4,
    "lfm2_moe": lfm2,
}
