"""``radixserve pull | ls | rm`` and hf.co/ model references, against a fake hub on localhost
(tests/fake_hub.py): nothing is downloaded from the internet."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from fake_hub import FakeHub

from radixserve.__main__ import main
from radixserve.gguf_reader import open_gguf
from radixserve.hub import HubError, ModelNotPulled, parse_hub_ref, resolve_model
from radixserve.hub.cache import find_pulled, pulled_models
from radixserve.hub.pull import HubUnreachable, pull
from radixserve.hub.quant import group_models, pick_model, quant_label
from radixserve.models.default import default_model_path

REPO = "acme/tiny-GGUF"


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _split(src: str, dest: Path, max_tensors: int) -> list[Path]:
    """``src`` written as llama.cpp's gguf-split writes it: dest-0000k-of-0000n.gguf."""
    reader = open_gguf(src)
    writer = gguf.GGUFWriter(dest, str(reader.fields["general.architecture"].contents()),
                             split_max_tensors=max_tensors)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(dest.parent.glob(dest.stem + "-*-of-*.gguf"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Small stand-in files per quant, and the embedded model whole and in two parts."""
    root = tmp_path_factory.mktemp("hubfiles")
    out = {}
    for label in ("Q8_0", "Q4_K_M", "IQ4_XS", "f16"):
        out[label] = root / f"tiny-{label}.bin"
        out[label].write_bytes(f"weights of {label} ".encode() * 1000)
    out["model"] = Path(default_model_path())
    out["parts"] = _split(default_model_path(), root / "smol-Q4_1.gguf", 150)
    return out


@pytest.fixture
def hub(files, tmp_path, monkeypatch):
    repos = {
        REPO: {"tiny-Q8_0.gguf": files["Q8_0"], "tiny-Q4_K_M.gguf": files["Q4_K_M"],
               "tiny-IQ4_XS.gguf": files["IQ4_XS"], "mmproj-tiny-f16.gguf": files["f16"],
               "README.md": files["f16"]},
        "acme/no-default-GGUF": {"x-Q8_0.gguf": files["Q8_0"], "x-F16.gguf": files["f16"]},
        "acme/smol-GGUF": {"SmolLM2-135M-Instruct.Q4_1.gguf": files["model"]},
        "acme/split-GGUF": {p.name: p for p in files["parts"]},
    }
    with FakeHub(repos) as fake:
        fake.home = tmp_path / "hf"
        fake.patch(monkeypatch, fake.home)
        yield fake


# -- references and labels (no network) ----------------------------------------------------

@pytest.mark.parametrize("text, repo, tag", [
    ("hf.co/acme/m-GGUF:Q4_K_M", "acme/m-GGUF", "Q4_K_M"),
    ("huggingface.co/acme/m-GGUF", "acme/m-GGUF", None),
    ("https://huggingface.co/acme/m.v2-GGUF:latest", "acme/m.v2-GGUF", None),
    ("hf.co/acme/m-GGUF:m-q8_0.gguf", "acme/m-GGUF", "m-q8_0.gguf"),
])
def test_references_parse(text, repo, tag):
    ref = parse_hub_ref(text)
    assert (ref.repo_id, ref.tag, ref.revision) == (repo, tag, "main")
    assert parse_hub_ref(ref.name) == ref


@pytest.mark.parametrize("text", ["hf.co/acme", "hf.co/a/b/c", "hf.co/acme/m:Q4:x",
                                  "hf.co/-a/m", "hf.co/a--b/m", "acme/m"])
def test_bad_references_are_refused(text):
    with pytest.raises(HubError, match="OWNER/REPO|quant label|hub reference"):
        parse_hub_ref(text)
    assert parse_hub_ref("acme/m", bare=True).repo_id == "acme/m"  # `pull` takes it bare


@pytest.mark.parametrize("name, label", [
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("Q4_K_M/big-Q4_K_M-00001-of-00003.gguf", "Q4_K_M"),
    ("model-IQ4_XS.gguf", "IQ4_XS"), ("phi-3-mini-BF16.gguf", "BF16"),
    ("ggml-model-f16.gguf", "F16"), ("model.gguf", None),
])
def test_quant_labels_from_file_names(name, label):
    assert quant_label(name) == label


def test_a_split_model_needs_all_its_parts_and_projectors_are_no_models():
    models = group_models(["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf",
                           "m-F16-00001-of-00002.gguf", "mmproj-m-f16.gguf", "m.md"])
    assert [(m.label, m.files) for m in models] == [
        ("Q8_0", ("m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"))]
    assert pick_model(models, None, "x").stem == "m-Q8_0"


# -- pull ------------------------------------------------------------------------------------

def test_pull_by_label_fetches_that_file_only(hub, files):
    model = pull(parse_hub_ref(f"hf.co/{REPO}:q8_0"))
    assert model.name == f"hf.co/{REPO}:Q8_0"
    assert Path(model.path).read_bytes() == files["Q8_0"].read_bytes()
    fetched = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    assert fetched == [f"/{REPO}/resolve/main/tiny-Q8_0.gguf"]
    assert model.path.startswith(str(hub.home / "hub"))


def test_no_tag_takes_q4_k_m_of_several(hub, files):
    model = pull(parse_hub_ref(f"hf.co/{REPO}"))
    assert model.name == f"hf.co/{REPO}:Q4_K_M"
    assert Path(model.path).read_bytes() == files["Q4_K_M"].read_bytes()


def test_a_missing_label_is_an_error_listing_the_labels(hub):
    with pytest.raises(HubError, match=r"no 'Q5_K_M' model; pick one of: IQ4_XS, Q4_K_M, Q8_0"):
        pull(parse_hub_ref(f"hf.co/{REPO}:Q5_K_M"))
    with pytest.raises(HubError, match=r"none is Q4_K_M \(the default\); pick one of: F16, Q8_0"):
        pull(parse_hub_ref("hf.co/acme/no-default-GGUF"))
    with pytest.raises(HubError, match="no such repository"):
        pull(parse_hub_ref("hf.co/acme/missing"))


def test_offline_uses_the_cache_and_never_the_hub(hub, files, monkeypatch):
    from huggingface_hub import constants

    pulled = pull(parse_hub_ref(f"hf.co/{REPO}:Q8_0")).path
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    seen = len(hub.requests)
    assert resolve_model(f"hf.co/{REPO}:Q8_0") == pulled
    assert resolve_model(f"hf.co/{REPO}") == pulled  # the one pulled is the repo's only
    with pytest.raises(ModelNotPulled, match=r"not in the cache .*pulled from this repo: Q8_0"
                                             r".*radixserve pull hf.co/acme/tiny-GGUF:IQ4_XS"):
        resolve_model(f"hf.co/{REPO}:IQ4_XS")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert resolve_model(f"hf.co/{REPO}:Q8_0", offline=True) == pulled  # --offline
    assert len(hub.requests) == seen


def test_an_unreachable_hub_is_a_clear_error(hub, monkeypatch, capsys):
    from huggingface_hub import constants

    pulled = pull(parse_hub_ref(f"hf.co/{REPO}:Q8_0")).path
    dead = "http://127.0.0.1:9"  # discard: nothing listens
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    with pytest.raises(HubUnreachable, match="cannot reach the Hugging Face hub at "
                                             "http://127.0.0.1:9"):
        pull(parse_hub_ref(f"hf.co/{REPO}:Q8_0"))
    with pytest.raises(HubUnreachable, match="IQ4_XS is not in the cache"):
        resolve_model(f"hf.co/{REPO}:IQ4_XS")
    assert resolve_model(f"hf.co/{REPO}:Q8_0") == pulled  # a pulled copy still serves
    assert "cannot reach" in capsys.readouterr().err


def test_a_corrupt_download_is_detected_and_removed(hub, files):
    hub.corrupt.add("tiny-Q8_0.gguf")
    with pytest.raises(HubError, match="tiny-Q8_0.gguf is corrupt .*sha256.*removed: pull again"):
        pull(parse_hub_ref(f"hf.co/{REPO}:Q8_0"))
    assert not any((hub.home / "hub").rglob("tiny-Q8_0.gguf"))
    assert pulled_models() == []
    hub.corrupt.clear()
    model = pull(parse_hub_ref(f"hf.co/{REPO}:Q8_0"))
    assert _sha256(model.path) == _sha256(files["Q8_0"])


def test_an_interrupted_transfer_resumes_where_it_broke_off(hub, files):
    hub.cut_once.add("SmolLM2-135M-Instruct.Q4_1.gguf")
    model = pull(parse_hub_ref("hf.co/acme/smol-GGUF"))
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.endswith(".gguf")]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    assert _sha256(model.path) == _sha256(files["model"])


def test_a_split_model_is_joined_into_the_original_file(hub, files):
    model = pull(parse_hub_ref("hf.co/acme/split-GGUF:Q4_1"))
    assert model.name == "hf.co/acme/split-GGUF:Q4_1"
    assert Path(model.path).name == "smol-Q4_1.gguf" and "radixserve-joined" in model.path
    assert _sha256(model.path) == _sha256(files["model"])  # gguf-split --merge's file
    assert model.size_bytes == sum(p.stat().st_size for p in files["parts"])
    assert [m.name for m in pulled_models()] == [model.name]
    Path(model.path).unlink()  # e.g. an interrupted join: redone from the parts
    assert _sha256(find_pulled(parse_hub_ref("hf.co/acme/split-GGUF")).path) == \
        _sha256(files["model"])


# -- the CLI ---------------------------------------------------------------------------------

def test_cli_pull_ls_rm(hub, capsys):
    assert main(["pull", f"{REPO}:Q8_0"]) == 0  # the hf.co/ prefix is optional here
    assert main(["pull", f"hf.co/{REPO}:IQ4_XS"]) == 0
    out = capsys.readouterr()
    assert "pulled hf.co/acme/tiny-GGUF:IQ4_XS (18.0 KB)" in out.err
    assert out.out.strip().endswith("tiny-IQ4_XS.gguf")
    assert main(["ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "MODIFIED"]
    assert [line.split()[0] for line in lines[1:]] == [f"hf.co/{REPO}:IQ4_XS",
                                                      f"hf.co/{REPO}:Q8_0"]
    assert main(["rm", f"hf.co/{REPO}:iq4_xs"]) == 0
    assert capsys.readouterr().out == f"deleted 'hf.co/{REPO}:IQ4_XS'\n"
    assert [m.name for m in pulled_models()] == [f"hf.co/{REPO}:Q8_0"]
    assert main(["rm", f"hf.co/{REPO}:IQ4_XS"]) == 2
    assert "not pulled: hf.co/acme/tiny-GGUF:IQ4_XS" in capsys.readouterr().err
    assert main(["rm", f"hf.co/{REPO}"]) == 0  # no tag: the whole repo
    assert pulled_models() == []
    assert not (hub.home / "hub" / "models--acme--tiny-GGUF").exists()
    assert main(["pull", "hf.co/acme/tiny-GGUF:Q3_K_S"]) == 2
    assert "pick one of: IQ4_XS, Q4_K_M, Q8_0" in capsys.readouterr().err


def test_models_dir_catalog_finds_pulled_models(hub, tmp_path):
    from radixserve.frontend.models_dir.catalog import Catalog

    catalog = Catalog(str(tmp_path))
    assert catalog.find(f"hf.co/{REPO}:Q8_0") is None  # not pulled: a request never pulls
    model = pull(parse_hub_ref(f"hf.co/{REPO}:Q8_0"))
    entry = catalog.find(f"hf.co/{REPO}:q8_0")
    assert (entry.name, entry.path, entry.kind) == (f"hf.co/{REPO}:q8_0", model.path, "gguf")


@pytest.mark.slow
def test_generate_with_an_hf_co_model_end_to_end(hub, files):
    """A user's first `generate --model hf.co/...`: pulled with a progress bar, then run."""
    def generate(*extra):
        return subprocess.run(
            [sys.executable, "-m", "radixserve", "generate", "The capital of France is",
             "--model", "hf.co/acme/smol-GGUF", "--max-tokens", "8", *extra],
            capture_output=True, text=True, timeout=300, env=hub.env(hub.home), check=False)

    r = generate()
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "checking the sha256 of SmolLM2-135M-Instruct.Q4_1.gguf" in r.stderr
    hub.server.shutdown()  # offline from here: the cache serves
    r = generate("--offline")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_serve_an_hf_co_model_under_its_reference(hub):
    """`serve --model hf.co/...` pulls in the API process and serves the model by the name
    the user gave (the mock engine: no weights load)."""
    import httpx

    sys.path.insert(0, str(Path(__file__).parent / "server"))
    from server_proc import ServerProc

    server = ServerProc("--model", "hf.co/acme/smol-GGUF", "--mock-engine",
                        env=hub.env(hub.home))
    try:
        models = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == ["hf.co/acme/smol-GGUF"]
        r = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
            "model": "hf.co/acme/smol-GGUF", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    finally:
        assert server.stop() == 0
