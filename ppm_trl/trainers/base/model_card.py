"""The model card a saved model carries: the method's name, paper and BibTeX, tags, a local base model named, the
run's dataset, rewards, settings and judge model (`card_training_record`), and a licence.

This is the seam's too: it passes transformers' private `save_model(_internal_call=)` and imports
`trl.trainer.utils.get_config_model_id`, which `trl` does not export.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import fields
from pathlib import Path

from trl.trainer.utils import get_config_model_id

# TRL's fields a card records besides the method's own (`card_training_record`).
CARD_TRL_SETTINGS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "num_generations",
                     "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
                     "max_steps", "num_train_epochs", "temperature", "beta", "loss_type", "epsilon", "epsilon_high",
                     "scale_rewards", "num_iterations", "seed")
# The judge's settings a card records when a judge scored the run (never `judge_api_base`: it may hold credentials).
CARD_JUDGE_SETTINGS = ("judge_model", "judge_transport", "judge_temperature")


def card_training_record(trainer, dataset_name: str | None = None) -> dict:
    """What the run was, for its model card: method, dataset, reward functions (with weights), the judge model
    (None when no judge scored), and the settings — every field of the method's config that TRL's GRPOConfig does
    not have (judge fields only with a judge) and TRL's main ones (`CARD_TRL_SETTINGS`). Plain JSON values."""
    from trl import GRPOConfig

    from ...registry import method_of_trainer
    from ...scorers import scorer_judge

    method = method_of_trainer(type(trainer))
    args = trainer.args
    values = json.loads(json.dumps(args.to_dict(), default=str))
    scorers = trainer.method_scorers() if hasattr(trainer, "method_scorers") else []
    judge = next((j for j in map(scorer_judge, scorers) if j), None)
    trl_fields = {f.name for f in fields(GRPOConfig)}
    own = [f.name for f in fields(type(args)) if f.name not in trl_fields
           and (judge is not None or not f.name.startswith("judge_"))]
    if judge is not None:
        own = [name for name in own if not name.startswith("judge_") or name in CARD_JUDGE_SETTINGS]
    settings = {name: values[name] for name in (*CARD_TRL_SETTINGS, *own) if name in values}
    weights = trainer.outcome_reward_weights.tolist()
    return {
        "method": method.name if method else type(trainer).__name__,
        "adapter": adapter_of(trainer.model),
        "dataset": dataset_name or trainer.model_card_dataset or describe_dataset(trainer.train_dataset),
        "reward_funcs": [{"name": name, "weight": weight} for name, weight in zip(trainer.reward_func_names, weights)],
        "judge_model": getattr(judge, "model", None) if judge is not None else None,
        "settings": settings,
    }


def adapter_of(model) -> dict | None:
    """A PEFT model's adapter as its card records it (LoRA: r, alpha, dropout, target modules); None for a full
    fine-tune."""
    config = (getattr(model, "peft_config", None) or {}).get("default")
    if config is None:
        return None
    targets = getattr(config, "target_modules", None)
    return {"type": str(getattr(config, "peft_type", "adapter")).split(".")[-1].replace("LORA", "LoRA"),
            "r": getattr(config, "r", None), "lora_alpha": getattr(config, "lora_alpha", None),
            "lora_dropout": getattr(config, "lora_dropout", None),
            "target_modules": sorted(targets) if isinstance(targets, (set, list, tuple)) else targets}


def describe_dataset(dataset) -> str | None:
    """A synthetic env's name and horizon (its `env` and `n` columns), a Hub dataset's name, else None."""
    if dataset is None or not hasattr(dataset, "column_names"):
        return None
    columns = dataset.column_names or []
    if "env" in columns and hasattr(dataset, "__len__") and len(dataset):
        row = dataset[0]
        return f"ppm_trl synthetic env `{row['env']}`" + (f", n = {row['n']}" if "n" in columns else "") + \
            f" ({len(dataset)} problems)"
    name = getattr(getattr(dataset, "info", None), "dataset_name", None)
    # `load_dataset("json", data_files=...)` names the file format, not the data: that is no dataset name.
    if not name or name in _FILE_BUILDERS:
        return None
    return str(name)


_UNNAMED_DATASET = "not recorded (name it: `create_model_card(dataset_name=...)`, `model_card_dataset`)"
_FILE_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "generator", "pandas", "sql", "webdataset", "imagefolder",
                  "audiofolder", "videofolder"}


def base_model_license(base: str | None) -> dict | None:
    """{"license", "license_name"?, "license_link"?} that the base model's own card declares — a local directory's
    README.md, or a Hub model's from the local Hub cache (or the Hub, unless HF_HUB_OFFLINE) — or None."""
    if not base:
        return None
    from huggingface_hub import ModelCard, constants, hf_hub_download, try_to_load_from_cache

    path = os.path.join(base, "README.md") if os.path.isdir(base) else None
    if path is None:
        try:
            cached = try_to_load_from_cache(base, "README.md")
            path = cached if isinstance(cached, str) else (
                None if constants.HF_HUB_OFFLINE else hf_hub_download(base, "README.md"))
        except Exception:  # not a Hub id, no card, no network: no licence known
            return None
    if not path or not os.path.isfile(path):
        return None
    try:
        data = ModelCard.load(path).data
    except Exception:  # an unreadable card says nothing
        return None
    licence = data.get("license")
    if not isinstance(licence, str) or not licence.strip() or licence in ("license", "unknown"):
        return None
    return {"license": licence, **{key: data.get(key) for key in ("license_name", "license_link") if data.get(key)}}


def render_training_record(record: dict, licence: str, source: str | None) -> str:
    """The card section for `card_training_record`'s record."""
    rewards = ", ".join(f"`{r['name']}` (weight {r['weight']:g})" for r in record["reward_funcs"]) or "none"
    settings = ", ".join(f"`{name}`: {json.dumps(value)}" for name, value in record["settings"].items())
    unknown = " (no licence known: set one with `--license` or `create_model_card(license=...)`)"
    licence_line = f"`{licence}`" + (f" ({source})" if source else unknown)
    adapter = record.get("adapter")
    adapter_line = "full fine-tune (no adapter)" if not adapter else (
        f"{adapter['type']}, r {adapter['r']}, alpha {adapter['lora_alpha']}, dropout {adapter['lora_dropout']}, "
        f"target modules {adapter['target_modules']} (load with PEFT on the base model)")
    return ("### Training data, rewards and settings\n\n"
            f"- Method: `{record['method']}`\n"
            f"- Weights: {adapter_line}\n"
            f"- Dataset: {record['dataset'] or _UNNAMED_DATASET}\n"
            f"- Reward functions: {rewards}\n"
            f"- Judge model: {'`' + record['judge_model'] + '`' if record['judge_model'] else 'none (no LLM judge)'}\n"
            f"- Licence: {licence_line}\n"
            f"- Settings: {settings}\n\n")


class ModelCardWriter:
    """`save_model` writes the method's card; `create_model_card` completes TRL's (mixed into `MethodTrainer`)."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """Transformers' `save_model`, then (for a final save, not a checkpoint's) the method's model card: name,
        paper, BibTeX, tags (the class attributes `_name`, `_paper`, `_tag_names`) and the base model. TRL writes
        its card only with checkpoints and on `push_to_hub`; PEFT's `save_pretrained` leaves its own boilerplate."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and self.is_world_process_zero():
            output_dir = output_dir or self.args.output_dir
            self.create_model_card(model_name=Path(output_dir).name)
            # The run's picture beside the model, from Python as from `ppm-trl train` (skipped without matplotlib).
            from ...plots import save_training_curves

            save_training_curves(self.state.log_history, output_dir, Path(output_dir).name)
            card = os.path.join(self.args.output_dir, "README.md")
            if os.path.abspath(output_dir) != os.path.abspath(self.args.output_dir):
                shutil.copyfile(card, os.path.join(output_dir, "README.md"))

    # What the card records beyond TRL's (`card_training_record`); `ppm-trl train` sets the first two from its flags.
    model_card_dataset: str | None = None  # None: described from the train dataset (a synthetic env names itself)
    model_card_license: str | None = None  # None: the base model's licence (its own card), else "unknown"

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, license=None):
        """TRL's card, naming a local base model, with a real `license` and what the run was: dataset, reward
        functions, the method's settings and judge model (`card_training_record`; metadata key `ppm_trl`, and a
        section above TRL's framework versions). `push_to_hub` goes through here too. `license`: an SPDX id or Hub
        licence name; default `model_card_license`, else the licence the base model's own card declares
        (`base_model_license`), else `unknown` (TRL writes a placeholder, `licence: license`)."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        from huggingface_hub import ModelCard

        # TRL leaves a local base model out of the metadata (not a Hub id) and its template then prints
        # "fine-tuned version of [None]": name the local model instead.
        path = os.path.join(self.args.output_dir, "README.md")
        card = ModelCard.load(path)
        base = get_config_model_id(self.model.config)
        text = card.text
        if card.data.base_model is None and base:
            text = text.replace("[None](https://huggingface.co/None)", f"the local model `{base}` (a path on the "
                                "machine that trained it: others cannot load it from there; start from a Hub id, or "
                                "publish the base model too)")
        if self.hub_model_id is None:  # a local save: the card's usage snippet loads the local directory
            text = text.replace('model="None"', f'model="{os.path.abspath(self.args.output_dir)}"')
        record = card_training_record(self, dataset_name)
        licence = license or self.model_card_license
        source = "set for this run" if licence else None
        inherited = None if licence else base_model_license(base)
        if inherited:
            licence, source = inherited["license"], f"the base model's card (`{base}`)"
            for key in ("license_name", "license_link"):
                if inherited.get(key):
                    card.data[key] = inherited[key]
        card.data.pop("licence", None)  # TRL's placeholder
        card.data.license = licence or "unknown"
        card.data["ppm_trl"] = record
        section = render_training_record(record, card.data.license, source)
        marker = "### Framework versions"
        text = text.replace(marker, section + marker, 1) if marker in text else text + "\n" + section
        card.text = text
        card.save(path)
