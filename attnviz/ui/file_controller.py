"""New, Open, Recent, Save, Import and Export for one window.

A ``FileController`` is built from what it needs: the workspace (the document and the
results it saves and exports), the settings (recent files), the window (parent of its
dialogs), a message callback, what happens after a save (the autosave is cleared) and
``Targets`` (the grid and the heatmap an Import or Export applies to). File names need
not be UTF-8: they are kept exactly and shown with "�" for such bytes.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QByteArray, QObject, QSettings, Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QDialog, QFileDialog, QMenu, QMessageBox, QWidget

from attnviz.core.examples import Example
from attnviz.core.figures.figure import HeatmapSpec, spec_for
from attnviz.core.io import files
from attnviz.core.io.layers_files import holds_layers
from attnviz.core.maths.results import HEAD_MATRICES
from attnviz.core.maths.scenario import Scenario, ScenarioError
from attnviz.core.presets import make_preset
from attnviz.core.session import UNTITLED, proposed_file_name, untitled_name
from attnviz.ui.grid import MatrixGrid
from attnviz.ui.image_export import Figure, ImageExport
from attnviz.ui.images import ask_image_path
from attnviz.ui.workspace import Workspace

JSON_FILTER = "attnviz scenario (*.attn.json)"
NPZ_FILTER = "attnviz scenario, binary for large layers (*.attn.npz)"
OPEN_FILTER = ";;".join(
    ("attnviz scenarios (*.attn.json *.attn.npz)", JSON_FILTER, NPZ_FILTER, "All files (*)")
)
SAVE_FILTER = ";;".join((JSON_FILTER, NPZ_FILTER, "JSON (*.json)", "All files (*)"))
MATRIX_FILTER = "CSV (*.csv);;NumPy array (*.npy)"
MAX_RECENT = 8


@dataclass(frozen=True)
class Targets:
    """What Import/Export Matrix and Export Heatmap apply to, asked at the time."""

    grid: Callable[[], MatrixGrid]  # the matrix grid last used
    figure: Callable[[], tuple[str, HeatmapSpec]]  # (view name, figure) last looked at


class FileController(QObject):
    """The File menu's work; the window only builds the menu over it."""

    def __init__(
        self,
        ws: Workspace,
        settings: QSettings,
        parent_widget: QWidget,
        show_message: Callable[[str], None],
        saved: Callable[[], None],
        targets: Targets,
    ):
        super().__init__(parent_widget)
        self.ws, self.settings, self.parent_widget = ws, settings, parent_widget
        self.show_message, self.saved, self.targets = show_message, saved, targets
        self.image_export = ImageExport(self)  # heatmap images are written off the UI thread
        self.exporting = False
        self.image_export.progress.connect(self._export_progress)
        self.image_export.finished.connect(self._export_finished)
        # Esc stops an export; only while one runs, so that Esc still cancels a cell edit.
        self.stop_export = QShortcut(QKeySequence(Qt.Key.Key_Escape), parent_widget)
        self.stop_export.activated.connect(self.image_export.cancel)
        self.stop_export.setEnabled(False)
        # a file of several model layers opens through the model imports (set by the window)
        self.open_layers: Callable[[Path], bool] | None = None

    def close(self) -> None:
        self.image_export.close()

    # Files ------------------------------------------------------------------------------------

    def maybe_save(self) -> bool:
        """True when it is fine to drop the current document (saved, discarded)."""
        if self.ws.doc.undo_stack.isClean():
            return True
        name = files.printable(self.ws.doc.name) if self.ws.doc.path else "the untitled scenario"
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "Unsaved changes",
            f"Save the changes to {name}?",
            QMessageBox.StandardButton.Save
            | QMessageBox.StandardButton.Discard
            | QMessageBox.StandardButton.Cancel,
            self.parent_widget,
        )
        box.setDefaultButton(QMessageBox.StandardButton.Save)
        answer = box.exec()
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return answer == QMessageBox.StandardButton.Discard

    def new_document(self) -> None:
        if self.maybe_save():
            self.load(make_preset("worked-example"), None, "New scenario")
            self.saved()

    def load(
        self, scenario: Scenario, path: Path | None, text: str, untitled: str = UNTITLED
    ) -> None:
        """Replace the document as one undoable step; the loaded state counts as saved."""
        self.ws.doc.load(scenario, path, text, untitled)
        self.ws.doc.undo_stack.setClean()

    def open_dialog(self) -> None:
        if not self.maybe_save():
            return
        path, _ = QFileDialog.getOpenFileName(
            self.parent_widget, "Open scenario", self._folder(), OPEN_FILTER
        )
        if path:
            self.open_path(Path(path), ask=False)

    def open_path(self, path: Path, ask: bool = True) -> bool:
        """Load a scenario file; on any problem show it and keep the open document."""
        if ask and not self.maybe_save():
            return False
        if self.open_layers is not None and holds_layers(path):
            if not self.open_layers(path):
                return False
            self._add_recent(path.resolve())
            return True
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

    def open_examples(self) -> Example | None:
        """File → Open Example…: the gallery, then (unsaved work offered for saving once
        an example is chosen) the chosen example, untitled."""
        from attnviz.ui.examples_dialog import ExampleGallery

        gallery = ExampleGallery(self.settings, self.parent_widget)
        try:
            chosen = gallery.chosen() if gallery.exec() == QDialog.DialogCode.Accepted else None
        finally:
            gallery.deleteLater()
        if chosen is None or not self.maybe_save():
            return None
        return chosen if self.open_example(chosen) else None

    def open_example(self, example: Example) -> bool:
        """Load a shipped example with no path, so that a save never writes into the
        installation (Save asks where, proposing the example's name)."""
        try:
            scenario = example.load()
        except files.FileFormatError as e:
            self.error("Cannot open the example", str(e))
            return False
        untitled = untitled_name(example.path.name, "example")
        self.load(scenario, None, f"Open example {example.title}", untitled)
        self.saved()
        self.show_message(f"Opened the example {example.title} (untitled: Save asks where)")
        return True

    def save(self) -> bool:
        if self.ws.doc.path is None:
            return self.save_as()
        return self._write(self.ws.doc.path)

    def save_as(self) -> bool:
        """Ask for a name; the form (text or binary) follows its suffix, else the filter."""
        doc = self.ws.doc
        proposed = proposed_file_name(doc.name) if doc.path is None else None
        if proposed is not None:  # an example, a preset, a lesson stage, an import
            name = proposed
        elif doc.path is not None and files.is_binary(doc.path):
            name = "scenario" + files.NPZ_SUFFIX
        else:
            name = "scenario" + files.SUFFIX
        binary = files.is_binary(name)
        path, chosen = QFileDialog.getSaveFileName(
            self.parent_widget,
            "Save scenario",
            self._folder(name),
            SAVE_FILTER,
            NPZ_FILTER if binary else JSON_FILTER,
        )
        if not path:
            return False
        if not path.lower().endswith((".json", ".npz")):
            path += files.NPZ_SUFFIX if chosen == NPZ_FILTER else files.SUFFIX
        return self._write(Path(path))

    def _write(self, path: Path) -> bool:
        try:
            files.save_scenario(path, self.ws.doc.scenario)
        except OSError as e:
            self.error("Cannot save", f"{files.printable(path)}: {e.strerror or e}")
            return False
        except ScenarioError as e:  # e.g. an imported model's text the file cannot hold
            self.error("Cannot save", f"{files.printable(path.name)}: {e}")
            return False
        self.ws.doc.set_path(path.resolve())
        self._add_recent(path.resolve())
        self.saved()
        self.show_message(f"Saved {files.printable(path.name)}")
        return True

    def error(self, title: str, text: str) -> None:
        self.show_message(text.split("\n")[0])
        QMessageBox.warning(self.parent_widget, title, text)

    def _folder(self, name: str = "") -> str:
        base = self.ws.doc.path.parent if self.ws.doc.path else Path.home()
        return str(base / name) if name else str(base)

    def recent_files(self) -> list[str]:
        """Recently used files, newest first; names that are not UTF-8 come back exactly."""
        value = self.settings.value("recent", [])
        out = []
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, QByteArray):  # how _add_recent keeps such names
                out.append(os.fsdecode(bytes(item.data())))
            elif isinstance(item, str) and item:
                out.append(item)
        return out

    def _add_recent(self, path: Path) -> None:
        recent = [str(path)] + [p for p in self.recent_files() if p != str(path)]
        # QSettings would drop the undecodable bytes of a str, so those go as bytes.
        stored = [p if files.printable(p) == p else QByteArray(os.fsencode(p)) for p in recent]
        self.settings.setValue("recent", stored[:MAX_RECENT])

    def fill_recent(self, menu: QMenu) -> None:
        """Fill File → Open Recent (called as the menu opens)."""
        menu.clear()
        for p in self.recent_files():
            text = files.printable(p).replace("&", "&&")  # not a keyboard mnemonic
            menu.addAction(text).triggered.connect(lambda _=False, p=p: self.open_path(Path(p)))
        if menu.isEmpty():
            menu.addAction("(none)").setEnabled(False)

    # Matrices and images -------------------------------------------------------------------

    def import_matrix(self) -> None:
        grid = self.targets.grid()
        model = grid.matrix_model()
        path, _ = QFileDialog.getOpenFileName(
            self.parent_widget, f"Import into {model.title}", self._folder(), MATRIX_FILTER
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
        model = self.targets.grid().matrix_model()
        name = model.label.replace("[", "").replace("]", "").replace(".", "-")
        path, _ = QFileDialog.getSaveFileName(
            self.parent_widget, f"Export {model.title}", self._folder(f"{name}.csv"), MATRIX_FILTER
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
        name, spec = self.targets.figure()
        default = self._folder(f"head{self.ws.view_state.head + 1}-{name}.png")
        answer = ask_image_path(self.parent_widget, f"Export {spec.title}", default)
        if answer is not None:
            self.export_images([(spec, *answer)])

    def export_images(self, jobs: list[tuple[Figure, Path, float]]) -> None:
        """Write (spec, path, scale) images on the export thread, progress in the status bar."""
        if self.exporting:
            self.show_message("An export is still running: wait for it, or press Esc to stop it")
            return
        self.exporting = True
        self.stop_export.setEnabled(True)
        self.image_export.start(jobs)
        self.show_message(f"Exporting {len(jobs)} image{'s' * (len(jobs) > 1)}…")

    def _export_progress(self, done: int, total: int) -> None:
        self.show_message(f"Exporting images: {done} of {total}…")

    def _export_finished(self, written: list[Path], error: str) -> None:
        self.exporting = False
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
            self.parent_widget, "Export all pipeline heatmaps to", self._folder()
        )
        if folder:
            self.export_all_to(Path(folder))

    def export_all_to(self, folder: Path) -> list[Path]:
        """Every view of the selected head as PNG and SVG, on the export thread.

        Returns the files it will write (the first failure stops it and is reported).
        """
        head = self.ws.view_state.head
        layer = self.ws.compute.complete_getter()  # (of what the document holds now)
        jobs: list[tuple[Figure, Path, float]] = [
            (
                functools.partial(lambda name: spec_for(layer(), name, head), name),
                folder / f"head{head + 1}-{name}{suffix}",
                2.0,
            )
            for name in HEAD_MATRICES
            for suffix in (".png", ".svg")
        ]
        self.export_images(jobs)
        return [path for _, path, _ in jobs]

    def export_code(self, flavor: str) -> None:
        from attnviz.core.io.codegen import to_script

        name = f"attention_{flavor}.py"
        try:
            text = to_script(self.ws.doc.scenario, flavor, source="")
        except ValueError as e:  # the tiled script: a mask a kernel does not do
            self.error("Cannot export the script", str(e))
            return
        path, _ = QFileDialog.getSaveFileName(
            self.parent_widget, "Export as code", self._folder(name), "Python (*.py)"
        )
        if not path:
            return
        source = files.printable(self.ws.doc.path.name) if self.ws.doc.path else "untitled"
        try:
            text = to_script(self.ws.doc.scenario, flavor, source=source)
            files.atomic_write(path, text.encode())
        except OSError as e:
            self.error("Cannot export the script", f"{path}: {e.strerror or e}")
            return
        self.show_message(
            f"Wrote {Path(path).name}: run it with python to print every head's weights"
        )
