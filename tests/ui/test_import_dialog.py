"""The Import dialog offers the models on this machine and judges each config before any
weights load; Enter imports, Esc cancels, and it keeps its size."""

from __future__ import annotations

import html
import json
import re
import shutil

import pytest

pytest.importorskip("transformers")

from offline_hub import offline  # noqa: F401  (autouse)
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QDialog
from tiny_models import fake_package, save_tiny

from attnviz.ui.model_import import ImportDialog

REVISION = "0123456789abcdef0123456789abcdef01234567"
TEXT = "the big dog ran to the house"


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return save_tiny("bert", tmp_path_factory.mktemp("models") / "bert")


def cached(tmp_path, model_id, folder, config=None):
    """``folder`` copied into the Hugging Face cache as ``model_id`` (refs/main set)."""
    repo = tmp_path / "hub" / f"models--{model_id.replace('/', '--')}"
    snapshot = shutil.copytree(folder, repo / "snapshots" / REVISION)
    if config is not None:
        (snapshot / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def machine(tmp_path, monkeypatch, bert_folder):
    """A cache with a BERT and a T5 whose weights are not even readable, and a package."""
    cached(tmp_path, "someone/tiny-bert", bert_folder)
    mamba = cached(tmp_path, "state-spaces/mamba-130m", bert_folder, {"model_type": "mamba"})
    (mamba / "model.safetensors").unlink()  # a link to the blob: replace it, not the blob
    (mamba / "model.safetensors").write_bytes(b"not safetensors: reading these would fail")
    files = {p.name: p.read_bytes() for p in bert_folder.iterdir()}
    fake_package(tmp_path / "site", "tiny-bert-model", files)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def dialog_on(qtbot, tmp_path, **values):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    for key, value in values.items():
        settings.setValue(f"import/{key}", value)
    dialog = ImportDialog(settings)
    qtbot.addWidget(dialog)
    dialog.text.setPlainText(TEXT)
    qtbot.waitUntil(lambda: dialog.found.text().startswith("On this machine"), timeout=20_000)
    return dialog


def choose(qtbot, dialog, source):
    row = dialog.source.findText(source)
    assert row >= 0, dialog.source.rows()
    dialog.source.setCurrentIndex(row)
    assert dialog.source.currentText() == source
    qtbot.waitUntil(lambda: " · " in dialog.verdict.text(), timeout=20_000)
    return html.unescape(re.sub("<[^>]+>", "", dialog.verdict.text()))


def test_the_list_offers_recent_sources_then_packages_and_cached_models(qtbot, machine):
    dialog = dialog_on(qtbot, machine, recent=["/somewhere/my-model", "someone/tiny-bert"])
    rows = {row[0]: row for row in dialog.source.rows()}
    order = [row[0] for row in dialog.source.rows()]
    assert order[:2] == ["/somewhere/my-model", "someone/tiny-bert"]  # recent first
    assert set(order) >= {"tiny-bert-model", "state-spaces/mamba-130m"}
    assert rows["someone/tiny-bert"][1:3] == ("bert", "recent · Hugging Face cache")
    assert rows["someone/tiny-bert"][4] == "✓ supported"
    assert rows["tiny-bert-model"][1:3] == ("bert", "installed package")
    mamba = rows["state-spaces/mamba-130m"]
    assert mamba[1] == "mamba" and mamba[4].startswith("✗") and "'mamba'" in mamba[4]
    assert rows["/somewhere/my-model"][2] == "recent"
    assert "2 models in the Hugging Face cache" in dialog.found.text()
    dialog.reject()


def test_the_preview_names_a_refusal_from_the_config_before_any_weights_load(
    qtbot, machine, bert_folder
):
    dialog = dialog_on(qtbot, machine)
    verdict = choose(qtbot, dialog, "state-spaces/mamba-130m")
    # the weights file is not safetensors: the verdict came from config.json alone
    assert verdict.startswith("mamba · ") and "✗ would be refused: model type 'mamba'" in verdict

    positions = json.loads((bert_folder / "config.json").read_text())["max_position_embeddings"]
    verdict = choose(qtbot, dialog, "someone/tiny-bert")
    assert verdict.startswith(f"bert · 3 layers · up to {positions} tokens · ✓")
    assert dialog.count.text().startswith("9 tokens")

    dialog.source.setCurrentText(str(bert_folder))  # a path can still be typed
    qtbot.waitUntil(lambda: dialog.verdict.text().startswith("bert · 3 layers"), timeout=20_000)
    dialog.source.setCurrentText("nobody/not-here")
    qtbot.waitUntil(
        lambda: "not in the Hugging Face cache" in dialog.verdict.text(), timeout=20_000
    )
    dialog.reject()


def test_enter_imports_escape_cancels_and_the_size_is_kept(qtbot, machine):
    dialog = dialog_on(qtbot, machine)
    dialog.show()
    qtbot.waitExposed(dialog)
    choose(qtbot, dialog, "tiny-bert-model")
    dialog.resize(820, 530)
    qtbot.keyClick(dialog.source.lineEdit(), Qt.Key.Key_Return)
    assert dialog.result() == QDialog.DialogCode.Accepted
    assert dialog.request().source == "tiny-bert-model"
    assert dialog.source.count() == len(dialog.source.rows())  # Enter added no item

    again = dialog_on(qtbot, machine)
    again.show()
    qtbot.waitExposed(again)
    assert (again.width(), again.height()) == (820, 530)
    assert again.source.currentText() == "tiny-bert-model"
    qtbot.keyClick(again.source.lineEdit(), Qt.Key.Key_Escape)
    assert again.result() == QDialog.DialogCode.Rejected
