"""The auto-complete worker is skipped only when no model source can define auto_complete_config."""

from inferd.supervisor.core.loader import _mentions_auto_complete


def _model(tmp_path, files):
    root = tmp_path / "m"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def test_plain_model_needs_no_auto_complete(tmp_path):
    assert not _mentions_auto_complete(_model(tmp_path, {"1/model.py": "class TritonPythonModel:\n    pass\n"}))


def test_method_in_model_py(tmp_path):
    src = "class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n        return c\n"
    assert _mentions_auto_complete(_model(tmp_path, {"1/model.py": src}))


def test_method_in_a_helper_module_next_to_the_model(tmp_path):
    files = {"1/model.py": "from base import Base\nclass TritonPythonModel(Base):\n    pass\n",
             "base.py": "class Base:\n    def auto_complete_config(c):\n        return c\n"}
    assert _mentions_auto_complete(_model(tmp_path, files))
    files2 = {"1/model.py": "from pkg.base import Base\n", "1/pkg/base.py": "def auto_complete_config(c): ...\n"}
    assert _mentions_auto_complete(_model(tmp_path / "x", files2))
