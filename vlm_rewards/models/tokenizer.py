"""A small byte-level BPE tokenizer with Qwen's special tokens and ChatML chat template, for tiny models.

Real checkpoints bring their own tokenizer; tiny test models trained from scratch use this one, built
the way Qwen2's is (NFC, Qwen's pre-tokenizer regex, byte-level BPE) so every code path that touches
the tokenizer (special tokens, chat template, padding, generation) behaves as with a real checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from vlm_rewards.resources import corpus_file

CORPUS_PATH = corpus_file()  # data/corpus/instructions.txt, shipped as package data

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VISION_PAD = "<|vision_pad|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD)

# ChatML as in Qwen-VL checkpoints: string or list content; image/video items become a vision block.
# Unlike Qwen2-VL's template no default system prompt is inserted (as in Qwen3-VL's).
CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}"
    "{%- set video_count = namespace(value=0) -%}"
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{ 'Picture ' + image_count.value | string + ': ' }}{%- endif -%}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'video' or 'video' in item -%}"
    "{%- set video_count.value = video_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{ 'Video ' + video_count.value | string + ': ' }}{%- endif -%}"
    "{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in item -%}"
    "{{ item['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def default_corpus() -> list[str]:
    """The shipped instruction corpus (data/corpus/instructions.txt), one text per line."""
    return [line for line in CORPUS_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts`, with Qwen's special tokens, pad/eos and chat template.

    Every byte is in the vocabulary, so any text encodes; the vocabulary stops growing below
    `vocab_size` when the corpus has no more merges to learn.
    """
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    trained = json.loads(bpe.to_str())["model"]
    # Qwen2Tokenizer rebuilds the same pipeline from vocab + merges and saves as a real checkpoint does.
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(merge) for merge in trained["merges"]],
        unk_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[token for token in SPECIAL_TOKENS if token not in (IM_END, ENDOFTEXT)],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
