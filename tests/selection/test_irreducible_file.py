"""Issue 43: the irreducible-loss file loads like every other state file of the library. Each row of the issue's
fault table (NaN losses, a loss array 7 rows short, truncation at 50% and 97%, 8 bytes flipped in three places,
an empty file) is refused with one `InvalidState` line naming the file and the field, before anything is trained,
built or written; with ``on_invalid="refit"`` the file is fitted again, the reason said in one warning line.
Files in 1.0's plain ``np.savez`` layout load validated when the caller gives ``num_examples``, and are refused
with a message saying how otherwise."""
import dataclasses
import io
import json
import re
import warnings
import zipfile

import numpy as np
import pytest

from replayloader import InvalidState
from replayloader.selection import (IrreducibleLosses, IrreducibleModel, ProvenanceMismatch, digest, fit_irreducible,
                                    irreducible_losses)
from replayloader.state import load_state, save_state

N = 300  # training examples of the main model


class LogisticIL:
    """The documented example's IL model (docs/selection.md): logistic regression on a hold-out split, seed 0.
    ``calls`` records every callable fit_irreducible makes, so a refused file is seen to train nothing."""

    def __init__(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(600, 5))
        y = np.where(rng.random(600) < 0.2, x[:, 0] <= 0, x[:, 0] > 0).astype(float)
        self.train_x, self.train_y = x[:N], y[:N]
        self.fit_x, self.fit_y, self.val_x, self.val_y = x[300:500], y[300:500], x[500:], y[500:]
        self.w, self.calls = np.zeros(5), []
        self.provenance = {"data": digest(x, y), "split": "300 / 200 / 100 in order", "label_noise_seed": 0,
                           "model": "logistic regression, lr 0.5"}

    def train(self, steps):
        self.calls.append("train")
        for _ in range(steps):
            p = 1.0 / (1.0 + np.exp(-self.fit_x @ self.w))
            self.w = self.w - 0.5 * self.fit_x.T @ (p - self.fit_y) / len(self.fit_y)

    def evaluate(self):
        self.calls.append("evaluate")
        return float(((self.val_x @ self.w > 0) == self.val_y).mean())

    def snapshot(self):
        return self.w.copy()

    def restore(self, w):
        self.w = w

    def score(self):
        self.calls.append("score")
        z = self.train_x @ self.w
        return np.logaddexp(0.0, z) - self.train_y * z

    def options(self, **extra):
        return {**dict(train=self.train, evaluate=self.evaluate, snapshot=self.snapshot, restore=self.restore,
                       score=self.score, provenance=self.provenance, steps=60, eval_every=20), **extra}


@pytest.fixture
def fitted(tmp_path):
    """A good IL file, and the model it holds."""
    path = tmp_path / "il.npz"
    model = fit_irreducible(path, **LogisticIL().options())
    assert not model.loaded and model.losses.shape == (N,)
    return path, model


def write_legacy(path, model, **changes):
    """The file exactly as 1.0's `IrreducibleModel.save` wrote it (plain np.savez, a JSON "meta" member)."""
    fields = dict(losses=model.losses, train_cpu_s=model.train_cpu_s, score_cpu_s=model.score_cpu_s,
                  train_wall_s=model.train_wall_s, score_wall_s=model.score_wall_s, select_cpu_s=model.select_cpu_s,
                  select_wall_s=model.select_wall_s, quality=model.quality, best_step=model.best_step,
                  steps=model.steps, higher_is_better=model.higher_is_better,
                  curve_steps=np.array([c[0] for c in model.curve], np.int64),
                  curve_quality=np.array([c[1] for c in model.curve], np.float64),
                  meta=np.array(json.dumps({"format": "replayloader.irreducible/2", "provenance": model.provenance,
                                            "fit": model.fit}, sort_keys=True)))
    fields.update(changes)
    with open(path, "wb") as f:
        np.savez(f, **fields)


def rewrite_state(path, **changes):
    """The file rewritten through the state path with some fields changed (digests recomputed: only the
    validation of the content can catch it)."""
    state = load_state(path)
    state.update(changes)
    save_state(state, path)


def nan_losses(path, model):
    losses = model.losses.copy()
    losses[17] = np.nan
    rewrite_state(path, losses=losses)
    return r"\['losses'\]\[17\] = nan must be finite"


def short_losses(path, model):
    rewrite_state(path, losses=model.losses[:-7].copy())
    return r"\['losses'\] must have shape \(300,\), got \(293,\)"


def truncated(fraction):
    def damage(path, model):
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * fraction)])
        return "not a readable state archive"
    return damage


def flipped(where):
    """8 bytes flipped (xor 0xFF): in the losses' bytes, in the JSON member, in the zip's central directory."""
    def damage(path, model):
        data = bytearray(path.read_bytes())
        at = {"losses": data.find(model.losses.tobytes()[:16]) + 80,
              "json": data.find(b'"format"'),
              "directory": data.rfind(b"PK\x01\x02") + 16}[where]  # +16: the member's CRC-32 in the directory
        assert at > 0
        data[at:at + 8] = bytes(b ^ 0xFF for b in data[at:at + 8])
        path.write_bytes(bytes(data))
        member = "losses" if where == "losses" else "__meta__"  # the directory's last entry: the JSON member
        return f"Bad CRC-32 for file '{member}.npy'"
    return damage


def empty(path, model):
    path.write_bytes(b"")
    return "not a readable state archive"


DAMAGE = {"nan losses": nan_losses, "7 rows short": short_losses, "truncated 50%": truncated(0.5),
          "truncated 97%": truncated(0.97), "flipped in the losses": flipped("losses"),
          "flipped in the JSON": flipped("json"), "flipped in the directory": flipped("directory"), "empty": empty}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_file_is_refused_in_one_line_naming_it_and_nothing_is_trained_or_written(fitted, damage):
    path, model = fitted
    field = damage(path, model)
    before = path.read_bytes()
    il = LogisticIL()
    with pytest.raises(InvalidState) as refused:
        fit_irreducible(path, **il.options())
    message = str(refused.value)
    assert message.startswith(str(path)) and "\n" not in message and re.search(field, message)
    assert "on_invalid='refit'" in message  # says how to go on
    assert il.calls == [] and path.read_bytes() == before  # nothing trained, nothing written
    assert sorted(p.name for p in path.parent.iterdir()) == ["il.npz"]  # no temporary file left
    for load in (IrreducibleModel.load, IrreducibleLosses.load):  # the direct readers refuse it too
        with pytest.raises(InvalidState, match=re.escape(str(path))):
            load(path)


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_file_is_refit_when_asked_and_the_reason_is_said(fitted, damage):
    path, model = fitted
    field = damage(path, model)
    il = LogisticIL()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refit = fit_irreducible(path, **il.options(on_invalid="refit"))
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "\n" not in said[0] and said[0].startswith("refitting the irreducible-loss model")
    assert str(path) in said[0] and re.search(field, said[0]) and caught[0].filename == __file__
    assert not refit.loaded and "train" in il.calls
    assert refit.losses.tolist() == model.losses.tolist() and refit.best_step == model.best_step  # same fit
    again = fit_irreducible(path, **LogisticIL().options())  # the file is whole again
    assert again.loaded and again.losses.tolist() == model.losses.tolist()


def test_the_untouched_file_loads_and_every_check_passes(fitted):
    path, model = fitted
    il = LogisticIL()
    again = fit_irreducible(path, **il.options(num_examples=N))
    assert again.loaded and il.calls == [] and again.losses.tolist() == model.losses.tolist()
    assert (again.curve, again.best_step, again.quality) == (model.curve, model.best_step, model.quality)
    assert not again.losses.flags.writeable


@pytest.mark.parametrize("change, field", [
    ({"train_cpu_s": -1.0}, r"\['train_cpu_s'\] must be a finite number >= 0.0, got -1.0"),
    ({"select_wall_s": float("inf")}, r"\['select_wall_s'\] must be a finite number >= 0.0, got inf"),
    ({"best_step": 61}, r"\['best_step'\] must be in \[1, 60\], got 61"),
    ({"best_step": 0}, r"\['best_step'\] must be in \[1, 60\], got 0"),
    ({"best_step": 30}, r"\['best_step'\] = 30 is not a step of its curve"),
    ({"quality": 0.123}, r"\['quality'\] = 0.123 is not the curve's quality at best_step"),
    ({"curve_steps": np.array([20, 20, 60])}, r"\['curve_steps'\] must rise strictly within \[1, 60\]"),
    ({"curve_quality": np.array([0.5, np.nan, 0.6])}, r"\['curve_quality'\]\[1\] = nan must be finite"),
    ({"examples": 0}, r"\['examples'\] must be >= 1, got 0"),
    ({"provenance": "{}"}, r"\['provenance'\] must be a non-empty JSON object"),
    ({"fit": "not json"}, r"\['fit'\] is not JSON"),
    ({"format": "replayloader.irreducible/9"}, r"\['format'\] must be 'replayloader.irreducible/3'"),
    ({"higher_is_better": 1}, r"\['higher_is_better'\] must be True or False, got 1"),
])
def test_each_field_is_checked_and_named(fitted, change, field):
    path, _ = fitted
    rewrite_state(path, **change)
    with pytest.raises(InvalidState, match=re.escape(str(path)) + field):
        IrreducibleModel.load(path)


def test_a_valid_file_for_other_inputs_is_never_refit(fitted):
    path, _ = fitted
    before = path.read_bytes()
    il = LogisticIL()
    with pytest.raises(ProvenanceMismatch):
        fit_irreducible(path, **il.options(on_invalid="refit", provenance={**il.provenance, "label_noise_seed": 1}))
    with pytest.raises(ValueError, match="holds 300 irreducible losses, expected num_examples = 301"):
        fit_irreducible(path, **il.options(on_invalid="refit", num_examples=301))
    assert il.calls == [] and path.read_bytes() == before


def test_on_invalid_is_checked_before_anything_runs(tmp_path):
    il = LogisticIL()
    with pytest.raises(ValueError, match="on_invalid must be 'refuse' or 'refit', got 'ignore'"):
        fit_irreducible(tmp_path / "il.npz", **il.options(on_invalid="ignore"))
    assert il.calls == [] and not (tmp_path / "il.npz").exists()


# ------------------------------------------------------------------------------------- files written by 1.0
def test_a_1_0_file_loads_validated_given_num_examples_and_is_refused_with_how_to_without(fitted):
    path, model = fitted
    write_legacy(path, model)
    il = LogisticIL()
    old = fit_irreducible(path, **il.options(num_examples=N))
    assert old.loaded and il.calls == [] and old.losses.tolist() == model.losses.tolist()
    assert (old.curve, old.provenance, old.fit) == (model.curve, model.provenance, model.fit)
    with pytest.raises(InvalidState) as refused:
        fit_irreducible(path, **il.options())
    message = str(refused.value)
    assert message.startswith(str(path)) and "written by replayloader 1.0" in message and "\n" not in message
    assert "pass num_examples=" in message and "on_invalid='refit'" in message and il.calls == []


@pytest.mark.parametrize("change, field", [
    ({"losses": np.where(np.arange(N) == 5, np.nan, 1.0)}, r"\['losses'\]\[5\] = nan must be finite"),
    ({"losses": np.ones(N - 7)}, r"\['losses'\] must have shape \(300,\), got \(293,\)"),
    ({"score_cpu_s": np.float64(-2.0)}, r"\['score_cpu_s'\] must be a finite number >= 0.0"),
    ({"best_step": np.int64(100)}, r"\['best_step'\] must be in \[1, 60\], got 100"),
    ({"meta": np.array("{")}, r"\['meta'\] is not JSON"),
])
def test_a_damaged_1_0_file_rewritten_with_np_savez_is_refused(fitted, change, field):
    path, model = fitted
    write_legacy(path, model, **change)
    il = LogisticIL()
    with pytest.raises(InvalidState, match=re.escape(str(path)) + field):
        fit_irreducible(path, **il.options(num_examples=N))
    assert il.calls == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refit = fit_irreducible(path, **il.options(num_examples=N, on_invalid="refit"))
    assert len(caught) == 1 and re.search(field, str(caught[0].message)) and not refit.loaded
    assert load_state(path)["format"] == "replayloader.irreducible/3"  # replaced by a state file


def test_a_truncated_1_0_file_is_refused_in_the_librarys_words(fitted):
    path, model = fitted
    write_legacy(path, model)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(InvalidState, match=re.escape(str(path)) + ": not a readable") as refused:
        fit_irreducible(path, **LogisticIL().options(num_examples=N))
    assert "\n" not in str(refused.value)


def test_the_1_0_function_validates_its_file_and_still_reads_its_1_0_layout(tmp_path):
    path = tmp_path / "irreducible.npz"
    first = irreducible_losses(path, 4, lambda: 0.5, lambda model: np.arange(4) * model)
    assert load_state(path)["kind"] == "losses"  # written through the state path now
    with open(path, "wb") as f:  # 1.0's IrreducibleLosses.save layout
        np.savez(f, losses=first.losses, train_cpu_s=0.1, score_cpu_s=0.2, train_wall_s=0.3, score_wall_s=0.4)
    old = irreducible_losses(path, 4, lambda: pytest.fail("no"), lambda model: pytest.fail("no"))
    assert old.losses.tolist() == [0.0, 0.5, 1.0, 1.5] and old.score_wall_s == 0.4
    with open(path, "wb") as f:
        np.savez(f, losses=np.r_[0.0, np.inf, 0, 0], train_cpu_s=0.1, score_cpu_s=0.2, train_wall_s=0.3,
                 score_wall_s=0.4)
    with pytest.raises(InvalidState, match=re.escape(str(path)) + r"\['losses'\]\[1\] = inf must be finite"):
        irreducible_losses(path, 4, lambda: pytest.fail("no"), lambda model: pytest.fail("no"))
    with pytest.raises(InvalidState, match="pass num_examples="):
        IrreducibleLosses.load(path)
    path.write_bytes(b"")
    with pytest.raises(InvalidState, match=re.escape(str(path))):
        irreducible_losses(path, 4, lambda: pytest.fail("no"), lambda model: pytest.fail("no"))


def test_a_loss_changed_inside_the_archive_with_a_valid_zip_crc_is_caught_by_its_digest(fitted):
    """Past zip's CRC (the member rewritten whole), the sha256 recorded beside every array still names it."""
    path, model = fitted
    members = {}
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            members[name] = archive.read(name)
    changed = model.losses.copy()
    changed[3] += 1.0
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, changed)
    members["losses.npy"] = buffer.getvalue()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    il = LogisticIL()
    with pytest.raises(InvalidState, match=re.escape(str(path)) + r": array 'losses' does not match its recorded "
                                           r"sha256"):
        fit_irreducible(path, **il.options())
    assert il.calls == []


# ------------------------------------------------------------------ the outside client's findings (issue 43)
def write_1_0_losses(path, losses, **costs):
    """The file exactly as 1.0's `IrreducibleLosses.save` (so `irreducible_losses`) wrote it: losses, four costs."""
    with open(path, "wb") as f:
        np.savez(f, losses=losses, **{"train_cpu_s": 0.1, "score_cpu_s": 0.2, "train_wall_s": 0.3,
                                      "score_wall_s": 0.4, **costs})


@pytest.mark.parametrize("layout", ["1.0 np.savez", "state file"])
def test_a_losses_only_file_is_read_by_irreducible_losses_load_and_refused_as_a_model_with_one_hint(fitted, layout):
    path, model = fitted
    if layout == "1.0 np.savez":
        write_1_0_losses(path, model.losses)
    else:
        IrreducibleLosses(model.losses, 0.1, 0.2, 0.3, 0.4).save(path)
    assert IrreducibleLosses.load(path, num_examples=N).losses.tolist() == model.losses.tolist()
    with pytest.raises(InvalidState) as refused:
        IrreducibleModel.load(path, num_examples=N)
    message = str(refused.value)
    assert message.startswith(f"{path} has no provenance (written by irreducible_losses") and "\n" not in message
    assert message.endswith("; read its losses with IrreducibleLosses.load") and message.count(";") == 1
    il = LogisticIL()
    for num_examples in (N, None):  # the kind is said first: no advice to pass num_examples that would not help
        with pytest.raises(InvalidState) as refused:
            fit_irreducible(path, **il.options(num_examples=num_examples))
        message = str(refused.value)
        assert message.startswith(f"{path} has no provenance (written by irreducible_losses")
        assert "num_examples" not in message
        assert message.endswith("; delete it, or pass on_invalid='refit', to fit the irreducible-loss model again")
        assert message.count(";") == 1 and "another path" not in message
    assert il.calls == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refit = fit_irreducible(path, **il.options(num_examples=N, on_invalid="refit"))
    assert len(caught) == 1 and not refit.loaded and IrreducibleModel.load(path).losses.tolist() == \
        model.losses.tolist()


def test_a_1_0_model_file_without_num_examples_gives_one_way_forward(fitted):
    path, model = fitted
    write_legacy(path, model)
    for load in (IrreducibleModel.load, IrreducibleLosses.load):
        with pytest.raises(InvalidState) as refused:
            load(path)
        message = str(refused.value)
        assert message.endswith("; pass num_examples=<number of training examples> to load it validated")
        assert message.count(";") == 1 and "written by replayloader 1.0" in message
    assert IrreducibleModel.load(path, num_examples=N).losses.tolist() == model.losses.tolist()


BAD_SAVES = {
    "NaN losses": (dict(losses=np.full(3, np.nan)), r"\['losses'\]\[0\] = nan must be finite"),
    "negative cost": (dict(train_cpu_s=-1.0), r"\['train_cpu_s'\] must be a finite number >= 0.0, got -1.0"),
    "infinite cost": (dict(score_wall_s=np.inf), r"\['score_wall_s'\] must be a finite number >= 0.0, got inf"),
    "empty losses": (dict(losses=np.zeros(0)), r"\['losses'\] must hold one loss per training example"),
    "2-D losses": (dict(losses=np.zeros((3, 2))), r"\['losses'\] must hold one loss per training example"),
}


@pytest.mark.parametrize("change, field", BAD_SAVES.values(), ids=BAD_SAVES.keys())
def test_irreducible_losses_save_refuses_what_load_would_refuse_and_writes_nothing(tmp_path, change, field):
    fields = {"losses": np.arange(3.0), "train_cpu_s": 0.1, "score_cpu_s": 0.2, "train_wall_s": 0.3,
              "score_wall_s": 0.4, **change}
    path = tmp_path / "il.npz"
    with pytest.raises(ValueError, match=r"^IrreducibleLosses" + field) as refused:
        IrreducibleLosses(**fields).save(path)
    assert not isinstance(refused.value, InvalidState) and str(refused.value).endswith(f"nothing was written to {path}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change, field", [
    (dict(losses=np.full(N, np.nan)), r"\['losses'\]\[0\] = nan must be finite"),
    (dict(train_cpu_s=-1.0), r"\['train_cpu_s'\] must be a finite number >= 0.0, got -1.0"),
    (dict(select_wall_s=np.nan), r"\['select_wall_s'\] must be a finite number >= 0.0, got nan"),
    (dict(best_step=1000), r"\['best_step'\] must be in \[1, 60\], got 1000"),
    (dict(best_step=30), r"\['best_step'\] = 30 is not a step of its curve"),
    (dict(quality=0.123), r"\['quality'\] = 0.123 is not the curve's quality at best_step"),
    (dict(curve=()), r"\['curve_steps'\] must rise strictly"),
    (dict(provenance={}), r"\['provenance'\] must be a non-empty JSON object"),
    (dict(higher_is_better=1), r"\['higher_is_better'\] must be True or False, got 1"),
])
def test_irreducible_model_save_refuses_what_load_would_refuse_and_writes_nothing(fitted, tmp_path, change, field):
    _, model = fitted
    path = tmp_path / "new" / "il.npz"
    path.parent.mkdir()
    with pytest.raises(ValueError, match=r"^IrreducibleModel" + field):
        dataclasses.replace(model, **change).save(path)
    assert list(path.parent.iterdir()) == []
    model.save(path)  # the good one round-trips
    again = IrreducibleModel.load(path, num_examples=N)
    assert (again.losses.tolist(), again.curve, again.quality, again.provenance) == \
        (model.losses.tolist(), model.curve, model.quality, model.provenance)


def test_another_count_than_num_examples_is_a_provenance_mismatch_never_refit(fitted):
    path, model = fitted
    rewrite_state(path, losses=model.losses[:-7].copy(), examples=N - 7)  # cut and its count edited to match
    before = path.read_bytes()
    assert IrreducibleModel.load(path).losses.shape == (N - 7,)  # consistent in itself: only num_examples knows
    il = LogisticIL()
    for call in (lambda: fit_irreducible(path, **il.options(num_examples=N, on_invalid="refit")),
                 lambda: IrreducibleModel.load(path, num_examples=N),
                 lambda: IrreducibleLosses.load(path, num_examples=N)):
        with pytest.raises(ProvenanceMismatch) as refused:
            call()
        assert refused.value.differing == {"num_examples": (N - 7, N)}
        assert str(refused.value) == (f"{path} holds 293 irreducible losses, expected num_examples = 300; delete it, "
                                      f"or give another path, to compute them for these inputs")
    assert il.calls == [] and path.read_bytes() == before


@pytest.mark.parametrize("bad", [123, None, b"il.npz"])
def test_a_path_that_is_no_path_is_named(tmp_path, bad, fitted):
    _, model = fitted
    message = f"path must be a str or os.PathLike, got {bad!r}"
    calls = [lambda: fit_irreducible(bad, **LogisticIL().options()),
             lambda: irreducible_losses(bad, 3, lambda: None, lambda model: np.zeros(3)),
             lambda: IrreducibleModel.load(bad), lambda: IrreducibleLosses.load(bad), lambda: model.save(bad),
             lambda: IrreducibleLosses(np.zeros(3), 0.0, 0.0, 0.0, 0.0).save(bad)]
    for call in calls:
        with pytest.raises(TypeError, match=re.escape(message)):
            call()


def test_bad_scores_and_callables_are_named(tmp_path):
    path = tmp_path / "il.npz"
    with pytest.raises(TypeError, match="^train must be callable, got str$"):
        irreducible_losses(path, 3, "x", lambda model: np.zeros(3))
    with pytest.raises(TypeError, match="^score must be callable, got int$"):
        irreducible_losses(path, 3, lambda: None, 3)
    with pytest.raises(ValueError, match=r"^score\(model\) must return one loss per training example, shape \(4,\), "
                                         r"got \(3,\) \(num_examples = 4\)$"):
        irreducible_losses(path, 4, lambda: None, lambda model: np.zeros(3))
    with pytest.raises(ValueError, match=r"^score\(model\) must return numbers, one loss per training example, got "
                                         r"dtype <U1$"):
        irreducible_losses(path, 2, lambda: None, lambda model: np.array(["a", "b"]))
    il = LogisticIL()
    with pytest.raises(ValueError, match=r"^score\(\) must return one loss per training example, shape \(310,\), "
                                         r"got \(300,\) \(num_examples = 310\)$"):
        fit_irreducible(path, **il.options(num_examples=310))
    with pytest.raises(ValueError, match=r"^score\(\) must return numbers"):
        fit_irreducible(path, **il.options(score=lambda: ["a"] * N))
    assert list(tmp_path.iterdir()) == []


def test_a_flipped_first_byte_is_refused_in_the_librarys_words(fitted):
    path, _ = fitted
    data = bytearray(path.read_bytes())
    data[:8] = bytes(b ^ 0xFF for b in data[:8])
    path.write_bytes(bytes(data))
    with pytest.raises(InvalidState) as refused:
        fit_irreducible(path, **LogisticIL().options())
    assert str(refused.value).startswith(f"{path}: not a readable state archive (truncated or damaged?): it does "
                                         f"not start with a zip header;") and "pickle" not in str(refused.value)
