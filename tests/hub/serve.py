"""A local stand-in for the part of the Hugging Face Hub that ``datasets.load_dataset`` uses.

    python tests/hub/serve.py --port 8765          # then: HF_ENDPOINT=http://127.0.0.1:8765 python train.py data=agnews

It serves one small parquet dataset repo for every hub dataset the project names, laid out as
on the real hub (repo id, config name, split names and file paths, column names and types,
``ClassLabel`` names in the card's order, the card's YAML header with ``dataset_info`` and
``configs``). ``CogComp/trec`` is a loading-script repo on ``main`` and serves its data from the
``refs/convert/parquet`` branch, laid out as the hub's parquet conversion is
(``default/<split>/0000.parquet``, no card). Rows are generated deterministically: each class
has its own words, so a model can learn the labels.

Endpoints (what huggingface_hub 2.x calls for dataset repos):

* ``GET  /api/datasets/{repo}`` and ``/api/datasets/{repo}/revision/{rev}``: repo info (sha, siblings)
* ``GET  /api/datasets/{repo}/tree/{rev}[/{path}]``: listing (``recursive`` query parameter)
* ``POST /api/datasets/{repo}/paths-info/{rev}``: metadata of the given paths
* ``HEAD|GET /datasets/{repo}/resolve/{rev}/{path}``: the file, with ``X-Repo-Commit``, ``ETag``,
  ``Content-Length`` (and ``Range`` support)

Errors carry the hub's ``X-Error-Code`` header (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``), which huggingface_hub turns into its exception types. Anything else is a 404.
It binds 127.0.0.1 only. Standard library plus pyarrow/datasets (to write the parquet files).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

# --------------------------------------------------------------------------- the cards
# Each entry mirrors the dataset card on huggingface.co (checked against the stored cards):
# features in the card's order, ClassLabel names as the card lists them, one config, the
# parquet paths of the hub's "Convert dataset to Parquet" layout.
STRING = "string"
TREC_FINE = [
    "ABBR:abb", "ABBR:exp", "ENTY:animal", "ENTY:body", "ENTY:color", "ENTY:cremat", "ENTY:currency",
    "ENTY:dismed", "ENTY:event", "ENTY:food", "ENTY:instru", "ENTY:lang", "ENTY:letter", "ENTY:other",
    "ENTY:plant", "ENTY:product", "ENTY:religion", "ENTY:sport", "ENTY:substance", "ENTY:symbol",
    "ENTY:techmeth", "ENTY:termeq", "ENTY:veh", "ENTY:word", "DESC:def", "DESC:desc", "DESC:manner",
    "DESC:reason", "HUM:gr", "HUM:ind", "HUM:title", "HUM:desc", "LOC:city", "LOC:country", "LOC:mount",
    "LOC:other", "LOC:state", "NUM:code", "NUM:count", "NUM:date", "NUM:dist", "NUM:money", "NUM:ord",
    "NUM:other", "NUM:period", "NUM:perc", "NUM:speed", "NUM:temp", "NUM:volsize", "NUM:weight",
]


@dataclass
class Card:
    repo_id: str
    config: str
    features: list[tuple[str, object]]  # (name, "string" | "int32" | [ClassLabel names])
    label: str  # the ClassLabel column the classes (and the class words) follow
    files: dict[str, str]  # split -> path in the repo
    unlabelled: tuple[str, ...] = ()  # splits whose label is -1 (hidden test sets, unsupervised)
    parquet_branch: bool = False  # data only on refs/convert/parquet; main holds a loading script
    card_configs: bool = True  # the card lists `configs` (else datasets infers the splits from file names)


CARDS: dict[str, Card] = {c.repo_id: c for c in [
    Card("fancyzhx/ag_news", "default",
         [("text", STRING), ("label", ["World", "Sports", "Business", "Sci/Tech"])], "label",
         {"train": "data/train-00000-of-00001.parquet", "test": "data/test-00000-of-00001.parquet"}),
    Card("stanfordnlp/imdb", "plain_text", [("text", STRING), ("label", ["neg", "pos"])], "label",
         {"train": "plain_text/train-00000-of-00001.parquet", "test": "plain_text/test-00000-of-00001.parquet",
          "unsupervised": "plain_text/unsupervised-00000-of-00001.parquet"}, unlabelled=("unsupervised",)),
    Card("fancyzhx/yelp_polarity", "plain_text", [("text", STRING), ("label", ["1", "2"])], "label",
         {"train": "plain_text/train-00000-of-00001.parquet", "test": "plain_text/test-00000-of-00001.parquet"}),
    Card("Yelp/yelp_review_full", "yelp_review_full",
         [("label", ["1 star", "2 star", "3 stars", "4 stars", "5 stars"]), ("text", STRING)], "label",
         {"train": "yelp_review_full/train-00000-of-00001.parquet",
          "test": "yelp_review_full/test-00000-of-00001.parquet"}),
    Card("fancyzhx/amazon_polarity", "amazon_polarity",
         [("label", ["negative", "positive"]), ("title", STRING), ("content", STRING)], "label",
         {"train": "amazon_polarity/train-00000-of-00001.parquet",
          "test": "amazon_polarity/test-00000-of-00001.parquet"}),
    Card("fancyzhx/dbpedia_14", "dbpedia_14",
         [("label", ["Company", "EducationalInstitution", "Artist", "Athlete", "OfficeHolder",
                     "MeanOfTransportation", "Building", "NaturalPlace", "Village", "Animal", "Plant", "Album",
                     "Film", "WrittenWork"]), ("title", STRING), ("content", STRING)], "label",
         {"train": "dbpedia_14/train-00000-of-00001.parquet", "test": "dbpedia_14/test-00000-of-00001.parquet"}),
    Card("community-datasets/yahoo_answers_topics", "yahoo_answers_topics",
         [("id", "int32"),
          ("topic", ["Society & Culture", "Science & Mathematics", "Health", "Education & Reference",
                     "Computers & Internet", "Sports", "Business & Finance", "Entertainment & Music",
                     "Family & Relationships", "Politics & Government"]),
          ("question_title", STRING), ("question_content", STRING), ("best_answer", STRING)], "topic",
         {"train": "yahoo_answers_topics/train-00000-of-00001.parquet",
          "test": "yahoo_answers_topics/test-00000-of-00001.parquet"}),
    Card("stanfordnlp/sst2", "default",
         [("idx", "int32"), ("sentence", STRING), ("label", ["negative", "positive"])], "label",
         {"train": "data/train-00000-of-00001.parquet", "validation": "data/validation-00000-of-00001.parquet",
          "test": "data/test-00000-of-00001.parquet"}, unlabelled=("test",)),
    Card("CogComp/trec", "default",
         [("text", STRING), ("coarse_label", ["ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"]),
          ("fine_label", TREC_FINE)], "coarse_label",
         {"train": "default/train/0000.parquet", "test": "default/test/0000.parquet"}, parquet_branch=True),
    Card("cornell-movie-review-data/rotten_tomatoes", "default", [("text", STRING), ("label", ["neg", "pos"])],
         "label", {"train": "train.parquet", "validation": "validation.parquet", "test": "test.parquet"},
         card_configs=False),
]}

PARQUET_REF = "refs/convert/parquet"
ROWS = {"train": 400, "validation": 200, "test": 200, "unsupervised": 100}
FILLER = ["the", "a", "of", "and", "it", "was", "this", "that", "with", "for", "on", "is", "very", "just",
          "really", "about", "some", "more", "one", "all"]


def class_words(k: int) -> list[str]:
    """The words that mark class ``k`` (lower-case, one token each for the project's tokenizer)."""
    return [f"cls{k}w{j}" for j in range(6)]


def _text(rng: random.Random, k: int) -> str:
    words = rng.sample(class_words(k), 3) + rng.choices(FILLER, k=6)
    rng.shuffle(words)
    return " ".join(words)


def _features(card: Card):
    import datasets

    out = {}
    for name, kind in card.features:
        out[name] = datasets.ClassLabel(names=kind) if isinstance(kind, list) else datasets.Value(kind)
    return datasets.Features(out)


def split_rows(card: Card, split: str) -> dict[str, list]:
    """The rows of one split: labels cycle through the classes (-1 for unlabelled splits)."""
    rng = random.Random(f"{card.repo_id}/{split}")
    names = dict(card.features)[card.label]
    n = ROWS[split]
    labels = [i % len(names) for i in range(n)]
    rng.shuffle(labels)
    cols: dict[str, list] = {}
    for name, kind in card.features:
        if name == card.label:
            cols[name] = [-1] * n if split in card.unlabelled else labels
        elif isinstance(kind, list):  # another ClassLabel (trec's fine_label): the first fine class of the coarse one
            coarse = dict(card.features)[card.label]
            cols[name] = [next(i for i, f in enumerate(kind) if f.startswith(coarse[k] + ":")) for k in labels]
        elif kind == STRING:
            cols[name] = [_text(rng, k) for k in labels]
        else:
            cols[name] = list(range(n))
    return cols


def _parquet(card: Card, split: str) -> bytes:
    """Parquet bytes with the ``huggingface`` schema metadata (the features), as the hub's files have."""
    import datasets
    import pyarrow.parquet as pq

    table = datasets.Dataset.from_dict(split_rows(card, split), features=_features(card)).data.table
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _card_meta(card: Card, sizes: dict[str, int], with_configs: bool) -> dict:
    feats = []
    for name, kind in card.features:
        if isinstance(kind, list):
            feats.append({"name": name, "dtype": {"class_label": {"names": {str(i): n for i, n in enumerate(kind)}}}})
        else:
            feats.append({"name": name, "dtype": kind})
    info = {"config_name": card.config, "features": feats,
            "splits": [{"name": s, "num_bytes": sizes[s], "num_examples": ROWS[s]}
                       for s in card.files]}
    meta: dict = {"pretty_name": card.repo_id.split("/")[1], "dataset_info": info}
    if with_configs:
        meta["configs"] = [{"config_name": card.config, "default": True,
                            "data_files": [{"split": s, "path": p.rsplit("-", 2)[0] + "-*" if "-of-" in p else p}
                                           for s, p in card.files.items()]}]
    return meta


def _readme(meta: dict, title: str) -> bytes:
    """A card: the metadata header (JSON, which is YAML too), then the text."""
    return ("---\n" + json.dumps(meta, indent=2) + f"\n---\n\n# {title}\n\nLocal test fixture.\n").encode()


GITATTRIBUTES = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"


def build_repos(cards: dict[str, Card] = CARDS) -> dict[str, dict[str, dict[str, bytes]]]:
    """{repo_id: {branch: {path: bytes}}} for every card."""
    repos: dict[str, dict[str, dict[str, bytes]]] = {}
    for rid, card in cards.items():
        data = {p: _parquet(card, s) for s, p in card.files.items()}
        sizes = {s: len(data[p]) for s, p in card.files.items()}
        name = rid.split("/")[1]
        if card.parquet_branch:
            script = f"# {name}.py: a loading script (datasets>=4 cannot run it)\nimport datasets\n".encode()
            main = {".gitattributes": GITATTRIBUTES, "README.md": _readme(_card_meta(card, sizes, False), name),
                    f"{name}.py": script}
            repos[rid] = {"main": main, PARQUET_REF: {".gitattributes": GITATTRIBUTES, **data}}
        else:
            repos[rid] = {"main": {".gitattributes": GITATTRIBUTES,
                                   "README.md": _readme(_card_meta(card, sizes, card.card_configs), name), **data}}
    return repos


# --------------------------------------------------------------------------- the server
def _sha1(b: bytes) -> str:
    return hashlib.sha1(b).hexdigest()


def _blob_oid(b: bytes) -> str:  # git's blob id
    return _sha1(b"blob %d\0" % len(b) + b)


class Repo:
    def __init__(self, repo_id: str, branches: dict[str, dict[str, bytes]]):
        self.id = repo_id
        self.branches = branches
        self.sha = {b: _sha1(f"{repo_id}@{b}".encode() + b"".join(sorted(_blob_oid(v).encode() for v in f.values())))
                    for b, f in branches.items()}

    def files(self, rev: str) -> tuple[str, dict[str, bytes]] | None:
        for b, sha in self.sha.items():
            if rev in (b, sha):
                return sha, self.branches[b]
        return None


def _entry(path: str, files: dict[str, bytes]) -> dict | None:
    if path in files:
        b = files[path]
        e = {"type": "file", "oid": _blob_oid(b), "size": len(b), "path": path}
        if path.endswith(".parquet"):
            e["lfs"] = {"oid": hashlib.sha256(b).hexdigest(), "size": len(b), "pointerSize": 134}
        return e
    prefix = path.rstrip("/") + "/"
    if any(p.startswith(prefix) for p in files):
        return {"type": "directory", "oid": _sha1(prefix.encode()), "size": 0, "path": path.rstrip("/")}
    return None


def _listing(path: str, files: dict[str, bytes], recursive: bool) -> list[dict]:
    prefix = path.strip("/") + "/" if path.strip("/") else ""
    seen: dict[str, dict] = {}
    for p in sorted(files):
        if not p.startswith(prefix):
            continue
        parts = p[len(prefix):].split("/")
        depths = range(1, len(parts) + 1) if recursive else [1]
        for d in depths:
            sub = prefix + "/".join(parts[:d])
            if sub not in seen:
                seen[sub] = _entry(sub, files)
    return list(seen.values())


class Handler(BaseHTTPRequestHandler):
    server_version = "LocalHub/1"
    repos: dict[str, Repo] = {}
    log_requests = False
    requests: list[str] = []  # "METHOD path" of every request served, in order

    def log_message(self, fmt, *args):  # quiet unless asked
        if self.log_requests:
            super().log_message(fmt, *args)

    # -- helpers
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, obj, headers: dict | None = None):
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})},
                   head=self.command == "HEAD")

    def _error(self, code: str, message: str, status: int = 404, headers: dict | None = None):
        self._send(status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message,
                    **(headers or {})}, head=self.command == "HEAD")

    def _route(self):
        """(kind, repo, rev, path) parsed from the URL, or None."""
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
            rid, rest = f"{parts[2]}/{parts[3]}", parts[4:]
            if not rest or rest == [""]:
                return "info", rid, "main", ""
            if rest[0] in ("revision", "tree", "paths-info") and len(rest) >= 2:
                return rest[0], rid, rest[1], "/".join(rest[2:])
        if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            return "resolve", f"{parts[1]}/{parts[2]}", parts[4], "/".join(parts[5:])
        return None

    def _resolve_repo(self, rid: str, rev: str):
        repo = self.repos.get(rid)
        if repo is None:
            self._error("RepoNotFound", f"Repository not found: {rid}", 401)
            return None
        found = repo.files(rev)
        if found is None:
            self._error("RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo, found[0], found[1]

    # -- verbs
    def do_GET(self):
        self._handle()

    def do_HEAD(self):
        self._handle()

    def do_POST(self):
        self._handle()

    def _handle(self):
        self.requests.append(f"{self.command} {self.path}")
        route = self._route()
        if route is None:
            return self._send(404, b"Not found", head=self.command == "HEAD")
        kind, rid, rev, path = route
        got = self._resolve_repo(rid, rev)
        if got is None:
            return
        repo, sha, files = got
        query = parse_qs(urlsplit(self.path).query)
        if kind in ("info", "revision"):
            return self._json({"id": rid, "_id": _sha1(rid.encode())[:24], "author": rid.split("/")[0], "sha": sha,
                               "private": False, "gated": False, "disabled": False, "downloads": 0, "likes": 0,
                               "tags": [], "lastModified": "2024-01-01T00:00:00.000Z",
                               "siblings": [{"rfilename": p} for p in sorted(files)]})
        if kind == "tree":
            if path and _entry(path, files) is None:
                return self._error("EntryNotFound", f"{path} does not exist on {rev}")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self._json(_listing(path, files, recursive))
        if kind == "paths-info":
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            ctype = self.headers.get("Content-Type", "")
            paths = json.loads(body).get("paths", []) if "json" in ctype else parse_qs(body).get("paths", [])
            return self._json([e for p in paths if (e := _entry(p, files)) is not None])
        # resolve
        if path not in files:
            return self._error("EntryNotFound", f"{path} does not exist on {rev}", headers={"X-Repo-Commit": sha})
        data = files[path]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{_blob_oid(data)}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and self.command == "GET":
            start_s, _, end_s = rng[6:].partition("-")
            start = int(start_s or 0)
            end = min(int(end_s), len(data) - 1) if end_s else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(206, data[start:end + 1], headers)
        self._send(200, data, headers, head=self.command == "HEAD")


class LocalHub:
    """``with LocalHub() as hub: ...`` serves the fixture repos on ``hub.url`` (127.0.0.1, a free port)."""

    def __init__(self, port: int = 0, repos: dict | None = None, log_requests: bool = False):
        built = repos if repos is not None else build_repos()
        self.requests: list[str] = []
        handler = type("BoundHandler", (Handler,), {"repos": {rid: Repo(rid, b) for rid, b in built.items()},
                                                     "log_requests": log_requests, "requests": self.requests})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    def start(self) -> LocalHub:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port (idempotent)."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    ap.add_argument("--log", action="store_true", help="log every request")
    args = ap.parse_args()
    hub = LocalHub(args.port, log_requests=args.log)
    print(f"serving {len(hub.httpd.RequestHandlerClass.repos)} dataset repos at {hub.url}; "
          f"use HF_ENDPOINT={hub.url}  (Ctrl-C stops)", flush=True)
    try:
        hub.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        hub.httpd.server_close()


if __name__ == "__main__":
    main()
