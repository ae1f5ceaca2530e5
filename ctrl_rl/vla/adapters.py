"""LoRA adapters on a VLA backbone (peft), their checks, and merging them into the base weights for export.

``apply_lora(backbone, rank, alpha, targets, vision)`` injects peft LoRA layers in place into the modules of the
backbone's language model (and, with ``vision``, its vision tower) whose last name component is one of
``targets``; every base weight is frozen, the adapters (initialised so the model's output is unchanged, peft's
default: B = 0) are trainable. A target that matches no module is refused with one sentence.
``merge_lora(module)`` folds every adapter into its base weight (``W + alpha / r * B A``) and puts the plain
layers back, so an exported graph has no peft code in it.
"""

from __future__ import annotations

import re

from torch import nn

from ctrl_rl.errors import UserInputError


def lora_pattern(backbone, targets: list[str], vision: bool) -> str:
    """The regex (peft's ``target_modules`` as a string is a full match on module names) of the adapted modules."""
    names = "|".join(re.escape(t) for t in targets)
    scopes = [backbone.language_model_pattern] + ([backbone.vision_pattern] if vision else [])
    return "|".join(f"(?:{scope.rstrip('$').removesuffix('.*')}.*\\.(?:{names}))" for scope in scopes)


def apply_lora(backbone, rank: int, alpha: float, targets: str, vision: bool = False, dropout: float = 0.0) -> None:
    """Inject LoRA of ``rank`` into ``backbone.vlm`` in place (module docstring)."""
    from peft import LoraConfig, inject_adapter_in_model

    wanted = [t.strip() for t in targets.split(",") if t.strip()]
    if not wanted:
        raise UserInputError(f"invalid --lora-targets {targets!r}: "
                             "expected comma-separated module names such as q_proj,v_proj")
    pattern = lora_pattern(backbone, wanted, vision)
    names = [n for n, m in backbone.vlm.named_modules() if isinstance(m, nn.Linear)]
    for t in wanted:
        if not any(re.fullmatch(pattern, n) and n.rsplit(".", 1)[-1] == t for n in names):
            have = sorted({n.rsplit(".", 1)[-1] for n in names if re.fullmatch(backbone.language_model_pattern, n)})
            raise UserInputError(f"--lora-targets names {t!r}, which matches no linear layer of the backbone's "
                                 f"{'language model or vision tower' if vision else 'language model'}: "
                                 f"expected one of {have}")
    for p in backbone.vlm.parameters():
        p.requires_grad_(False)
    # peft annotates lora_alpha as int but only divides by it (scaling = alpha / r): a float alpha works
    config = LoraConfig(r=rank, lora_alpha=alpha,  # pyright: ignore[reportArgumentType]
                        lora_dropout=dropout, target_modules=pattern)
    inject_adapter_in_model(config, backbone.vlm)
    for n, p in backbone.vlm.named_parameters():
        p.requires_grad_("lora_" in n)


def merge_lora(module: nn.Module) -> int:
    """Fold every LoRA layer inside ``module`` into its base layer and swap the plain layer back; returns how many."""
    from peft.tuners.lora import LoraLayer

    merged = 0
    for name, m in list(module.named_modules()):
        if isinstance(m, LoraLayer):
            m.merge()
            parent_name, _, child = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            setattr(parent, child, m.get_base_layer())
            merged += 1
    return merged


def trainable_fraction(module: nn.Module) -> float:
    """Trainable parameters over all parameters of ``module``."""
    total = sum(p.numel() for p in module.parameters())
    return sum(p.numel() for p in module.parameters() if p.requires_grad) / max(total, 1)
