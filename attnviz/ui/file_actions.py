"""The window's file actions: new, open, recent, save, drop, import and export.

A mixin of MainWindow: it uses the window's document, settings, panels and messages.
File names need not be UTF-8: they are kept exactly and shown with "�" for such bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QByteArray
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox
from shiboken6 import isValid

from attnviz.core.figures.figure import HeatmapSpec, spec_for
from attnviz.core.io import files
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.presets import make_preset
from attnviz.ui.grid import MatrixGrid

SCENARIO_FILTER = "attnviz scenario (*.attn.json);;JSON (*.json);;All files (*)"
MATRIX_FILTER = "CSV (*.csv);;NumPy array (*.npy)"
IMAGE_FILTER = "PNG image (*.png);;SVG vector image (*.svg)"
MAX_RECENT = 8


class FileActions:
    """Files, matrices and images for MainWindow (which provides doc, settings, panels)."""

    # Files ------------------------------------------------------------------------------------

    def maybe_save(self) -> bool:
        """True when it is fine to drop the current document (saved, discarded)."""
        if self.doc.undo_stack.isClean():
            return True
        name = files.printable(self.doc.path.name) if self.doc.path else "the untitled scenario"
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "Unsaved changes",
            f"Save the changes to {name}?",
            QMessageBox.StandardButton.Save
            | QMessageBox.StandardButton.Discard
            | QMessageBox.StandardButton.Cancel,
            self,
        )
        box.setDefaultButton(QMessageBox.StandardButton.Save)
        answer = box.exec()
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return answer == QMessageBox.StandardButton.Discard

    def new_document(self) -> None:
        if self.maybe_save():
            self.load(make_preset("worked-example"), None, "New scenario")
            self.clear_autosave()

    def load(self, scenario: Scenario, path: Path | None, text: str) -> None:
        """Replace the document as one undoable step; the loaded state counts as saved."""
        self.doc.load(scenario, path, text)
        self.doc.undo_stack.setClean()

    def open_dialog(self) -> None:
        if not self.maybe_save():
            return
        path, _ = QFileDialog.getOpenFileName(
            self, "Open scenario", self._folder(), SCENARIO_FILTER
        )
        if path:
            self.open_path(Path(path), ask=False)

    def open_path(self, path: Path, ask: bool = True) -> bool:
        """Load a scenario file; on any problem show it and keep the open document."""
        if ask and not self.maybe_save():
            return False
        try:
            scenario = files.load_scenario(path)
        except files.FileFormatError as e:
            self.error("Cannot open the file", str(e))
            return False
        name = files.printable(path.name)
        self.load(scenario, path.resolve(), f"Open {name}")
        self._add_recent(path.resolve())
        self.show_message(f"Opened {name}")
        return True

    def save(self) -> bool:
        if self.doc.path is None:
            return self.save_as()
        return self._write(self.doc.path)

    def save_as(self) -> bool:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save scenario", self._folder("scenario.attn.json"), SCENARIO_FILTER
        )
        if not path:
            return False
        if not path.endswith(".json"):
            path += files.SUFFIX
        return self._write(Path(path))

    def _write(self, path: Path) -> bool:
        try:
            files.save_scenario(path, self.doc.scenario)
        except OSError as e:
            self.error("Cannot save", f"{files.printable(path)}: {e.strerror or e}")
            return False
        self.doc.set_path(path.resolve())
        self._add_recent(path.resolve())
        self.clear_autosave()
        self.show_message(f"Saved {files.printable(path.name)}")
        return True

    def error(self, title: str, text: str) -> None:
        self.show_message(text.split("\n")[0])
        QMessageBox.warning(self, title, text)

    def _folder(self, name: str = "") -> str:
        base = self.doc.path.parent if self.doc.path else Path.home()
        return str(base / name) if name else str(base)

    def recent_files(self) -> list[str]:
        """Recently used files, newest first; names that are not UTF-8 come back exactly."""
        value = self.settings.value("recent", [])
        out = []
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, QByteArray):  # how _add_recent keeps such names
                out.append(os.fsdecode(item.data()))
            elif isinstance(item, str) and item:
                out.append(item)
        return out

    def _add_recent(self, path: Path) -> None:
        recent = [str(path)] + [p for p in self.recent_files() if p != str(path)]
        # QSettings would drop the undecodable bytes of a str, so those go as bytes.
        stored = [p if files.printable(p) == p else QByteArray(os.fsencode(p)) for p in recent]
        self.settings.setValue("recent", stored[:MAX_RECENT])

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for p in self.recent_files():
            text = files.printable(p).replace("&", "&&")  # not a keyboard mnemonic
            self._action(self.recent_menu, text, lambda _=False, p=p: self.open_path(Path(p)))
        if self.recent_menu.isEmpty():
            self.recent_menu.addAction("(none)").setEnabled(False)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = [u for u in event.mimeData().urls() if u.isLocalFile()]
        if urls:
            event.acceptProposedAction()
            self.open_path(Path(urls[0].toLocalFile()))

    # Matrices and images -------------------------------------------------------------------

    def _target_grid(self) -> MatrixGrid:
        """The grid that last had focus, unless it has gone (its head was removed)."""
        grid = self.last_grid
        if grid is None or not isValid(grid):
            return self.inputs.grid
        model = grid.matrix_model()
        if model.head is not None and model.head >= self.doc.scenario.n_heads:
            return self.inputs.grid
        return grid

    def import_matrix(self) -> None:
        grid = self._target_grid()
        model = grid.matrix_model()
        path, _ = QFileDialog.getOpenFileName(
            self, f"Import into {model.title}", self._folder(), MATRIX_FILTER
        )
        if path:
            self.import_matrix_from(grid, Path(path))

    def import_matrix_from(self, grid: MatrixGrid, path: Path) -> bool:
        model = grid.matrix_model()
        try:
            values = files.load_matrix(path)
        except files.FileFormatError as e:
            self.error("Cannot import the matrix", str(e))
            return False
        if values.shape != model.matrix().shape:
            shape = "×".join(map(str, model.matrix().shape))
            got = "×".join(map(str, values.shape))
            self.error(
                "Cannot import the matrix",
                f"{files.printable(path.name)}: {model.title} is {shape}, the file holds {got}",
            )
            return False
        name = files.printable(path.name)
        return model.set_block(0, 0, values, f"Import {name} into {model.title}")

    def export_matrix(self) -> None:
        model = self._target_grid().matrix_model()
        name = model.label.replace("[", "").replace("]", "").replace(".", "-")
        path, _ = QFileDialog.getSaveFileName(
            self, f"Export {model.title}", self._folder(f"{name}.csv"), MATRIX_FILTER
        )
        if path:
            try:
                files.save_matrix(path, model.matrix())
            except OSError as e:
                self.error("Cannot export the matrix", f"{path}: {e.strerror or e}")
                return
            except ScenarioError as e:
                self.error("Cannot export the matrix", str(e))
                return
            self.show_message(f"Exported {model.title} to {Path(path).name}")

    def export_heatmap(self) -> None:
        view = self.last_heatmap
        if view is None or not isValid(view) or view.spec is None:
            view = self.pipeline.views["weights"]
        spec = view.spec
        assert spec is not None
        default = self._folder(f"head{self.view_state.head + 1}-{view.name}.png")
        path, chosen = QFileDialog.getSaveFileName(
            self, f"Export {spec.title}", default, IMAGE_FILTER
        )
        if not path:
            return
        if Path(path).suffix.lower() not in (".png", ".svg"):
            path += ".svg" if "svg" in chosen.lower() else ".png"
        scale = 2.0
        if path.lower().endswith(".png"):
            scale, ok = QInputDialog.getDouble(
                self, "PNG scale", "Pixels per unit (1 = 100%):", 2.0, 0.25, 8.0, 2
            )
            if not ok:
                return
        self.export_images([(spec, Path(path), scale)])

    def export_images(self, jobs: list[tuple[HeatmapSpec, Path, float]]) -> None:
        """Write (spec, path, scale) images on the export thread, progress in the status bar."""
        if self._exporting:
            self.show_message("An export is still running: wait for it, or press Esc to stop it")
            return
        self._exporting = True
        self.stop_export.setEnabled(True)
        self.image_export.start(jobs)
        self.show_message(f"Exporting {len(jobs)} image{'s' * (len(jobs) > 1)}…")

    def _export_progress(self, done: int, total: int) -> None:
        self.show_message(f"Exporting images: {done} of {total}…")

    def _export_finished(self, written: list[Path], error: str) -> None:
        self._exporting = False
        self.stop_export.setEnabled(False)
        if error == "cancelled":
            self.show_message(f"Export stopped after {len(written)} of the images")
        elif error:
            self.error("Cannot export the image", error)
        elif len(written) == 1:
            self.show_message(f"Exported {files.printable(written[0].name)}")
        else:
            folder = files.printable(written[0].parent) if written else ""
            self.show_message(f"Exported {len(written)} images to {folder}")

    def export_all(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "Export all pipeline heatmaps to", self._folder()
        )
        if folder:
            self.export_all_to(Path(folder))

    def export_all_to(self, folder: Path) -> list[Path]:
        """Every view of the selected head as PNG and SVG, on the export thread.

        Returns the files it will write (the first failure stops it and is reported).
        """
        head = self.view_state.head
        jobs = [
            (
                spec_for(self.compute.result, name, head),
                folder / f"head{head + 1}-{name}{suffix}",
                2.0,
            )
            for name in self.pipeline.views
            for suffix in (".png", ".svg")
        ]
        self.export_images(jobs)
        return [path for _, path, _ in jobs]

    def export_code(self, flavor: str) -> None:
        from attnviz.core.io.codegen import to_script

        name = "attention_torch.py" if flavor == "torch" else "attention_numpy.py"
        path, _ = QFileDialog.getSaveFileName(
            self, "Export as code", self._folder(name), "Python (*.py)"
        )
        if not path:
            return
        source = files.printable(self.doc.path.name) if self.doc.path else "untitled"
        try:
            files.atomic_write(path, to_script(self.doc.scenario, flavor, source=source).encode())
        except OSError as e:
            self.error("Cannot export the script", f"{path}: {e.strerror or e}")
            return
        self.show_message(
            f"Wrote {Path(path).name}: run it with python to print every head's weights"
        )
