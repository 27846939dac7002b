"""`--help` in sections: which section each config key's option (and each other option of
`train`) is listed under, and the click command class that lists them so.

`train` has an option per config key, some 80 in all; one flat list hides the one a user is
after. The sections follow what a key is about, in the order a run is set up. A key added to
the config without a section here fails tests/test_help.py, so none is silently left out.
"""

from __future__ import annotations

import re

import click

# the sections, in the order `--help` lists them
ORDER = ("Run", "Model", "Data", "Optimiser", "Regularisation", "Evaluation",
         "Adaptive evaluation", "Precision", "Device", "GPU", "Distributed", "Output",
         "Profile", "Sampling (generate, chat)")

KEY_SECTIONS = {
    **dict.fromkeys(("SEED", "NUM_EPOCHS", "MAX_STEPS"), "Run"),
    **dict.fromkeys(("EMBED_DIM", "NUM_HEADS", "NUM_LAYERS", "SEQ_LEN"), "Model"),
    **dict.fromkeys(("DATASET", "DATA_DIR", "TOKENIZER", "TOKENIZER_PATH", "BPE_VOCAB",
                     "BATCH_SIZE", "RANDOM_OFFSETS"), "Data"),
    **dict.fromkeys(("OPTIMIZER", "LEARNING_RATE", "WARMUP_STEPS", "MIN_LR_RATIO", "GRAD_CLIP",
                     "WEIGHT_DECAY", "WD_SCHEDULE", "WD_FINAL", "BETA1", "BETA2", "ADAM_EPS",
                     "MOMENTUM", "NESTEROV", "CENTERED", "RMSPROP_ALPHA", "INITIAL_ACCUMULATOR",
                     "ADAGRAD_EPS", "RHO", "ADADELTA_EPS", "MUON_LR", "MUON_MOMENTUM",
                     "MUON_NESTEROV", "NS_STEPS", "ADAM_STATE_DTYPE"), "Optimiser"),
    **dict.fromkeys(("DROPOUT", "EMBD_DROPOUT", "ATTN_DROPOUT", "RESID_DROPOUT", "WORD_DROPOUT",
                     "LOCKED_DROPOUT", "LABEL_SMOOTHING", "EMA_DECAY", "EMA_START",
                     "AVERAGE_LAST_K"), "Regularisation"),
    **dict.fromkeys(("EVAL_INTERVAL", "PATIENCE", "EVAL_STRIDE", "EVAL_TOKENS"), "Evaluation"),
    **dict.fromkeys(("PRECISION", "FP8_SCALING"), "Precision"),
    **dict.fromkeys(("DEVICE", "STRICT_DEVICE", "THREADS", "CPU_JIT", "LM_HEAD_CHUNK"), "Device"),
    **dict.fromkeys(("GRAPH", "ATTENTION"), "GPU"),
    **dict.fromkeys(("NUM_GPUS", "GRAD_ACCUM_STEPS", "SHARD_OPTIMIZER", "BUCKET_MB",
                     "GRAD_REDUCE_DTYPE", "COMM_TIMEOUT"), "Distributed"),
    **dict.fromkeys(("MODEL_PATH", "LOG_FILE", "LOG_INTERVAL"), "Output"),
    **dict.fromkeys(("PROFILE", "PROFILE_MODE", "PROFILE_STEPS"), "Profile"),
    **dict.fromkeys(("TEMPERATURE", "TOP_P", "TOP_K"), "Sampling (generate, chat)"),
}

# train's options that are not config keys, by their parameter name
OPTION_SECTIONS = {
    **dict.fromkeys(("config", "allow_unknown_keys", "resume", "init_from",
                     "allow_data_change"), "Run"),
    "processes": "Distributed",
    "overwrite": "Output",
    "trace": "Profile",
    # eval's options of evaluation-time adaptation (--adapt)
    **dict.fromkeys(("adapt", "streams", "cache_window", "cache_theta", "cache_lambda",
                     "dynamic_lr", "dynamic_decay", "dynamic_segment"), "Adaptive evaluation"),
}


def section_of(param: click.Parameter) -> str | None:
    """The section an option is listed under, None for one outside them (--help)."""
    name = param.name or ""
    return OPTION_SECTIONS.get(name) or KEY_SECTIONS.get(name.upper())


def wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width`, broken at spaces; a word longer than a line breaks
    after a `-` or `/`, so a long default such as MODEL_PATH's `models/${DATASET}-L${NUM_
    LAYERS}-...` is never cut inside a name (a piece longer than a line stays whole)."""
    pieces = [(p, i == 0) for word in text.split()
              for i, p in enumerate(re.split(r"(?<=[\w}][-/])(?=[\w$])", word)
                                    if len(word) > width else [word])]
    lines: list[str] = []
    line = ""
    for piece, starts_word in pieces:
        sep = " " if line and starts_word else ""
        if line and len(line) + len(sep) + len(piece) > width:
            lines.append(line)
            line = piece
        else:
            line += sep + piece
    return [*lines, line] if line else lines


class SectionedCommand(click.Command):
    """A command whose `--help` lists its options under ORDER's sections (those it has),
    the rest under "Other options"; a command with no option in a section lists them as
    click does."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[bool, tuple[str, str]]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                section = section_of(param) or "Other options"  # a section's own options
                groups.setdefault(section, []).append((param.name not in OPTION_SECTIONS,
                                                       record))  # first, then its keys'
        if list(groups) == ["Other options"]:
            super().format_options(ctx, formatter)
            return
        first = min(max(len(term) for rows in groups.values() for _, (term, _) in rows), 30) + 2
        for title in (*ORDER, "Other options"):
            if title in groups:
                with formatter.section(title):
                    rows = sorted(groups[title], key=lambda row: row[0])
                    _write_rows(formatter, [record for _, record in rows], first)


def _write_rows(formatter: click.HelpFormatter, rows: list[tuple[str, str]],
                first: int) -> None:
    """click's definition list, wrapped by `wrap` (click's own wrapping cuts long words)."""
    indent = " " * formatter.current_indent
    width = max(formatter.width - first - formatter.current_indent, 20)
    for term, text in rows:
        lines = wrap(text, width) or [""]
        if len(term) + 2 <= first:
            formatter.write(f"{indent}{term:<{first}}{lines[0]}\n")
        else:
            formatter.write(f"{indent}{term}\n{indent}{'':<{first}}{lines[0]}\n")
        for line in lines[1:]:
            formatter.write(f"{indent}{'':<{first}}{line}\n")
