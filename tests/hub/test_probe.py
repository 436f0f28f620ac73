"""The reachability probe of the hub: direct to HF_ENDPOINT, or through the environment's proxy
(behind a cluster proxy a direct connect fails although downloads work)."""

from __future__ import annotations

import base64
import socket
import time

import pytest
from fake_proxy import FakeProxy
from hub_helpers import hub_env, train

from identifiable_transformers.data import sources as S

UNREACHABLE = "hub.invalid"  # RFC 2606: never resolves


@pytest.fixture
def endpoint(monkeypatch):
    """set(url): make huggingface_hub's endpoint ``url`` for this test; clears every proxy variable."""
    from huggingface_hub import constants

    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
              "no_proxy"):
        monkeypatch.delenv(k, raising=False)

    def set_(url: str) -> None:
        monkeypatch.setattr(constants, "ENDPOINT", url)

    return set_


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_direct_probe_follows_hf_endpoint(endpoint, local_hub):
    endpoint(local_hub.url)
    assert S.proxy_for(local_hub.url) is None and S.hub_reachable(1.0)
    local_hub.stop()
    assert not S.hub_reachable(1.0)


@pytest.mark.parametrize("var", ["HTTPS_PROXY", "https_proxy"])
def test_https_endpoint_behind_a_proxy_is_probed_through_it(endpoint, monkeypatch, var):
    endpoint(f"https://{UNREACHABLE}")
    with FakeProxy(status=200) as proxy:
        monkeypatch.setenv(var, proxy.url)
        assert not S.host_reachable(UNREACHABLE, 443, 1.0)  # what a direct probe would conclude
        assert S.hub_reachable(1.0)
        assert proxy.seen and proxy.seen[0][:2] == ("CONNECT", f"{UNREACHABLE}:443")


def test_proxy_that_cannot_reach_the_hub_means_unreachable(endpoint, monkeypatch):
    endpoint(f"https://{UNREACHABLE}")
    with FakeProxy(status=502) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        assert not S.hub_reachable(1.0)


def test_dead_proxy_means_unreachable_quickly(endpoint, monkeypatch):
    endpoint(f"https://{UNREACHABLE}")
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{_free_port()}")
    t = time.perf_counter()
    assert not S.hub_reachable(1.0)
    assert time.perf_counter() - t < 3


def test_no_proxy_exempts_the_hub_host(endpoint, monkeypatch):
    endpoint(f"https://{UNREACHABLE}")
    with FakeProxy(status=200) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", f"localhost,{UNREACHABLE}")
        assert S.proxy_for(f"https://{UNREACHABLE}") is None
        assert not S.hub_reachable(1.0) and not proxy.seen


def test_http_endpoint_goes_through_http_proxy_with_credentials(endpoint, monkeypatch, local_hub):
    endpoint(f"http://{UNREACHABLE}:{local_hub.port}")
    with FakeProxy(forward_to=("127.0.0.1", local_hub.port)) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://me:s%40cret@"))
        assert S.hub_reachable(1.0)
        method, path, headers = proxy.seen[0]
        assert (method, path) == ("HEAD", f"http://{UNREACHABLE}:{local_hub.port}/")
        assert headers["Proxy-Authorization"] == "Basic " + base64.b64encode(b"me:s@cret").decode()
    assert local_hub.requests  # the proxy forwarded the probe to the endpoint


def test_socks_proxy_is_not_probed(endpoint, monkeypatch):
    endpoint(f"https://{UNREACHABLE}")
    monkeypatch.setenv("ALL_PROXY", f"socks5://127.0.0.1:{_free_port()}")
    assert S.proxy_reachable(S.proxy_for(f"https://{UNREACHABLE}"), f"https://{UNREACHABLE}") is None
    assert S.hub_reachable(1.0)  # left to the hub client's own timeouts


@pytest.mark.slow
def test_train_through_a_proxy_when_the_hub_host_is_not_directly_reachable(local_hub, tmp_path):
    """Downloads through HTTP_PROXY work although the endpoint's host does not resolve here; then
    with proxy and endpoint gone, the second run comes from the HF cache."""
    with FakeProxy(forward_to=("127.0.0.1", local_hub.port)) as proxy:
        env = hub_env(tmp_path, f"http://{UNREACHABLE}:{local_hub.port}", HTTP_PROXY=proxy.url)
        proc, meta = train("agnews", tmp_path, env, "online")
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert "from the local cache only" not in proc.stdout + proc.stderr
        assert any(p.endswith(".parquet") for _, p, _ in proxy.seen)
    local_hub.stop()
    proc2, meta2 = train("agnews", tmp_path, env, "offline")
    assert proc2.returncode == 0, (proc2.stdout + proc2.stderr)[-4000:]
    assert "from the local cache only" in proc2.stdout + proc2.stderr
    assert meta2["rows"] == meta["rows"] and meta2["class_counts"] == meta["class_counts"]
