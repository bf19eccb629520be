"""Every registry of cryocube is one `plugins.Registry`: a second entry under a taken name is
refused in one sentence naming the module of each registration (a plug-in could otherwise shadow a
built-in, or the built-in it, by import order), and the first entry stays."""

from __future__ import annotations

import pytest

from cryocube.errors import PluginError, UserError

HERE = __name__  # the module a registration from this file is named by
CLI = "import sys; from cryocube.cli import main; sys.exit(main(sys.argv[1:]))"


def _reader():
    from cryocube.convert.base import READERS, register
    from cryocube.convert.paired import PairedRasterReader

    class Other(PairedRasterReader):
        name = "paired_raster"

    return READERS, "paired_raster", lambda: register(Other), "cryocube.convert.paired"


def _architecture():
    from cryocube.models.registry import ARCHITECTURES, register_architecture

    def build_vit(**kw):
        return None

    return (
        ARCHITECTURES,
        "vit",
        lambda: register_architecture("vit")(build_vit),
        "cryocube.models.vit",
    )


def _keymap():
    from cryocube.models.keymap import KEYMAP_FILE, KeyMap
    from cryocube.models.registry import KEYMAPS, register_keymap

    return KEYMAPS, "gfm", lambda: register_keymap(KeyMap(name="gfm")), str(KEYMAP_FILE)


def _family():
    from cryocube.families import FAMILIES, register
    from cryocube.families.vqa import Vqa

    class Other(Vqa):
        pass

    return FAMILIES, "vqa", lambda: register(Other), "cryocube.families.vqa"


def _adapter():
    from cryocube.adapters import ADAPTERS, register
    from cryocube.adapters.transformers_vlm import Transformers

    class Other(Transformers):
        pass

    return ADAPTERS, "transformers", lambda: register(Other), "cryocube.adapters.transformers_vlm"


def _cluster_backend():
    from cryocube.cluster.registry import BACKENDS, backend

    def local(req, stack):
        return None

    return BACKENDS, "local", lambda: backend("local")(local), "cryocube.cluster.local"


REGISTRIES = {
    "readers": _reader,
    "architectures": _architecture,
    "key maps": _keymap,
    "families": _family,
    "adapters": _adapter,
    "cluster backends": _cluster_backend,
}


@pytest.mark.parametrize("which", sorted(REGISTRIES))
def test_a_duplicate_name_is_refused_in_every_registry_naming_both_sources(which):
    registry, name, again, first = REGISTRIES[which]()
    registry.load()
    before = registry[name]
    with pytest.raises(PluginError) as e:
        again()
    msg = str(e.value)
    assert f"{name!r} is registered twice: by {first} and by {HERE}" in msg, msg
    assert "\n" not in msg and isinstance(e.value, UserError)
    assert registry[name] is before  # the first registration stands


def test_registering_the_same_entry_again_is_no_duplicate():
    """Importing a module twice (or a decorator applied to the one entry again) changes nothing."""
    from cryocube.convert.base import READERS, register
    from cryocube.convert.paired import PairedRasterReader
    from cryocube.families import FAMILIES
    from cryocube.families import register as register_family
    from cryocube.families.vqa import Vqa

    READERS.load()
    assert register(PairedRasterReader) is PairedRasterReader
    assert READERS["paired_raster"] is PairedRasterReader
    one = FAMILIES.named("vqa")
    register_family(Vqa)
    assert FAMILIES.named("vqa") is one and isinstance(one, Vqa)


def test_an_unknown_name_is_one_sentence_listing_the_known_ones():
    from cryocube.adapters import get
    from cryocube.models.registry import get_keymap

    with pytest.raises(PluginError, match=r"unknown key map 'nope'; known: .*gfm.*native"):
        get_keymap("nope")
    with pytest.raises(
        PluginError,
        match=r"unknown model adapter 'nope'; known: transformers \(`cryocube list adapters`\)",
    ):
        get("nope")


def test_a_plugin_that_takes_a_built_in_name_is_refused_naming_both_modules(run_with_plugin):
    """A real distribution on the path declares a reader under the built-in `paired_raster`:
    `cryocube list readers` says, in one line, which plug-in failed and which two modules
    registered the name; nothing is shadowed."""
    r = run_with_plugin(
        "shadowlab",
        "cryocube.readers",
        "from cryocube.convert.base import register\n"
        "from cryocube.convert.paired import PairedRasterReader\n\n\n"
        "@register\nclass Mine(PairedRasterReader):\n    name = 'paired_raster'\n",
        CLI,
        "list",
        "readers",
    )
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert (
        "plug-in 'shadowlab' (shadowlab) of cryocube.readers failed to load: PluginError: reader"
        " 'paired_raster' is registered twice: by cryocube.convert.paired and by shadowlab" in err
    ), err
