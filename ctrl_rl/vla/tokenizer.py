"""Instruction tokenizers for the VLA backbones: a tiny byte-level BPE built offline, and loading a saved one.

The id layout shared with ``ctrl_rl.vla.backbones`` (V = the language model's vocabulary size):

    [0, V - 264)        tokenizer ids (``tiny_tokenizer`` uses at most V - 264 of them)
    [V - 264, V - 256)  the backbone's special ids (image / video / vision start-end placeholders)
    [V - 256, V)        the 256 action bins, left free for the caller

``tiny_tokenizer`` trains a byte-level BPE (``tokenizers`` library) on a fixed built-in corpus of robot
instructions and common English words. Byte-level means every UTF-8 string encodes (the 256 byte symbols are
always in the vocabulary) and decodes back exactly (no normalisation, no prefix space). Special tokens take the
first ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3 (the tiny backbones set their text configs'
pad/bos/eos ids to match). Every encoding starts with ``<bos>``, so an empty instruction still has one real
token and no attention row is fully masked.

Determinism: ``tokenizers``' BPE trainer breaks count ties by pair ids, and the ids come from the sorted byte
alphabet and the merge order, so training on the same corpus gives the same merges in every process
(tests/vla/test_backbones.py pins the ids of two instructions; checked by hand across processes with
different hash seeds, tokenizers 0.23.3).
"""

from __future__ import annotations

import functools
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from ctrl_rl.errors import UserInputError

ACTION_BINS = 256
"""Ids [V - ACTION_BINS, V) are left free for the caller's action bins."""
BACKBONE_SPECIAL_IDS = 8
"""Ids [V - ACTION_BINS - BACKBONE_SPECIAL_IDS, V - ACTION_BINS) hold the backbones' special ids."""
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
"""Special tokens, in id order (``<pad>`` is id 0)."""

_BYTE_ALPHABET = 256
_MIN_TOKENIZER_SIZE = _BYTE_ALPHABET + len(SPECIAL_TOKENS)

_OBJECTS = ("cube", "block", "ball", "can", "cup", "bowl", "plate", "box", "drawer", "door", "lid", "peg",
            "bottle", "sponge", "towel", "banana", "apple", "mug", "button", "handle", "target", "goal")  # fmt: skip
_COLOURS = ("red", "green", "blue", "yellow", "black", "white", "orange", "purple", "pink", "gray")
_PLACES = ("on the plate", "in the bowl", "into the drawer", "on the table", "to the goal", "to the left",
           "to the right", "next to the cup", "in the box", "onto the shelf", "behind the block")  # fmt: skip
_TEMPLATES = (
    "pick up the {c} {o} and lift it",
    "pick up the {c} {o}",
    "lift the {c} {o}",
    "grasp the {c} {o}",
    "reach the {o}",
    "reach the {c} {o}",
    "push the {c} {o} {p}",
    "put the {c} {o} {p}",
    "place the {o} {p}",
    "move the {c} {o} {p}",
    "open the {o}",
    "close the {o}",
    "stack the {c} {o} on the {o2}",
    "slide the {o} {p}",
    "what action should the robot take to pick up the {c} {o}?",
)
_WORDS = (
    "the a an and or of to in on at by for with from into onto up down over under left right top bottom "
    "front back near far it this that these those is are was be do does not no yes please then after before "
    "robot arm hand gripper task action move turn rotate hold release drop carry open close push pull pick "
    "place put lift reach grasp slide stack insert remove take make go stop wait slowly quickly carefully "
    "one two three first second last next small large big little long short high low inside outside "
    "between around table shelf kitchen counter sink floor wall corner object objects thing things position "
    "In: Out: What should robot take ? . , ! ' - 0 1 2 3 4 5 6 7 8 9"
)


def _corpus() -> list[str]:
    """The fixed training corpus: instruction templates filled with objects, colours and places, then words."""
    lines = []
    for t in _TEMPLATES:
        for i, o in enumerate(_OBJECTS):
            c = _COLOURS[i % len(_COLOURS)]
            lines.append(t.format(c=c, o=o, p=_PLACES[i % len(_PLACES)], o2=_OBJECTS[(i + 3) % len(_OBJECTS)]))
    lines += ["reach the target", "push the block to the goal", "open the drawer", "put the cube on the plate"]
    lines += [f"the {c} {o}" for c in _COLOURS for o in _OBJECTS]
    lines.append(_WORDS)
    lines.append(_WORDS.capitalize())
    return lines


@functools.lru_cache(maxsize=8)
def _tokenizer_json(vocab_size: int) -> str:
    """Train the BPE for ``vocab_size`` and return its serialised form (cached: training takes ~50 ms)."""
    size = vocab_size - ACTION_BINS - BACKBONE_SPECIAL_IDS
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos = SPECIAL_TOKENS[1]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return tok.to_str()


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers tokenizer around ``tok``, with those of ``SPECIAL_TOKENS`` that its vocabulary has."""
    roles = dict(zip(("pad_token", "bos_token", "eos_token", "unk_token"), SPECIAL_TOKENS))
    present = {role: t for role, t in roles.items() if tok.token_to_id(t) is not None}
    return PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="right", **present)


def tiny_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A deterministic byte-level BPE of at most ``vocab_size - 264`` tokens (see the module docstring).

    ``vocab_size`` is the backbone's text vocabulary; the top 264 ids stay free for the backbone's special ids
    and the action bins.
    """
    if vocab_size - ACTION_BINS - BACKBONE_SPECIAL_IDS < _MIN_TOKENIZER_SIZE:
        minimum = _MIN_TOKENIZER_SIZE + ACTION_BINS + BACKBONE_SPECIAL_IDS
        raise UserInputError(f"vocab_size must be at least {minimum} for a byte-level tokenizer, got {vocab_size}")
    return _wrap(Tokenizer.from_str(_tokenizer_json(vocab_size)))


def load_tokenizer(directory: str | os.PathLike) -> PreTrainedTokenizerFast:
    """A tokenizer saved with ``save_pretrained``: ``tokenizer.json`` and, if present, ``tokenizer_config.json``.

    A bare ``tokenizer.json`` (as ``Tokenizer.save`` writes) gets the roles of ``SPECIAL_TOKENS`` it contains.
    """
    directory = os.fspath(directory)
    if not os.path.isfile(os.path.join(directory, "tokenizer.json")):
        raise UserInputError(
            f"tokenizer directory {directory} has no tokenizer.json: expected a directory written by save_pretrained"
        )
    if not os.path.isfile(os.path.join(directory, "tokenizer_config.json")):
        return _wrap(Tokenizer.from_file(os.path.join(directory, "tokenizer.json")))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
    tokenizer.padding_side = "right"
    return tokenizer


def encode_instructions(
    tokenizer: PreTrainedTokenizerFast, texts: list[str], max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, max_len] (right-padded with the pad id, truncated to ``max_len``) and mask [B, max_len].

    The mask is 1 on real tokens (including the leading ``<bos>``) and 0 on padding.
    """
    if isinstance(texts, str):
        raise UserInputError("texts must be a list of instruction strings, got a single string")
    if max_len < 1:
        raise UserInputError(f"max_len must be a positive number of tokens, got {max_len}")
    if tokenizer.pad_token_id is None:
        raise UserInputError("the tokenizer has no pad token: expected one set by tiny_tokenizer or save_pretrained")
    enc = tokenizer(
        list(texts),
        padding="max_length",
        truncation=True,
        max_length=max_len,
        padding_side="right",
        return_tensors="pt",
        return_attention_mask=True,
    )
    ids = enc["input_ids"].to(torch.long)  # [B,max_len]
    mask = enc["attention_mask"].to(torch.long)  # [B,max_len]
    return ids, mask
