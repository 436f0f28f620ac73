"""report.html in a real browser (headless Chromium through Selenium, issue 56): the overview renders one cell per
head, a URL fragment or a click shows that head's maps, drawn from the head's own attention.

Needs Debian's ``chromium`` and ``chromium-driver`` (.ci/run installs them); skipped without them.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from identifiable_transformers.diagnostics.render.report_html import build_report
from identifiable_transformers.models import TransformerClassifier

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                                reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
                                       "chromium-driver; .ci/run installs them)")
LAYERS, HEADS = 2, 3
LENGTHS = (5, 30)  # concat d = 12, h = 3: d/h = 4, so n = 5 is identifiable among row-stochastic maps, 30 is not


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    torch.manual_seed(0)
    model = TransformerClassifier(60, 2, embed_dim=12, num_heads=HEADS, num_layers=LAYERS).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 60, (2, max(LENGTHS)), generator=g)
    mask = torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]
    tokens = [[f"w{int(t)}" for t in row[:n]] for row, n in zip(ids, LENGTHS)]
    out = tmp_path_factory.mktemp("report")
    path = build_report(model, ids, mask, out, tokens=tokens, texts=[" ".join(t) for t in tokens],
                        label_names=["neg", "pos"])
    with torch.no_grad():
        attentions = model(ids, mask, output_attentions=True).attentions
    return path, attentions


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1200"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))  # no Selenium Manager: nothing downloaded
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_for_head(driver, b, l, h):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        f"const e = document.querySelector('#ex{b}-detail .head-detail');"
        f"return e.dataset.layer === '{l}' && e.dataset.head === '{h}';"))
    return driver.find_element("css selector", f"#ex{b}-detail .head-detail")


def _pixel(driver, b, kind, x, y):
    return driver.execute_script(
        f"const c = document.querySelector('#ex{b}-detail canvas[data-kind=\"{kind}\"]');"
        f"return Array.from(c.getContext('2d').getImageData({x}, {y}, 1, 1).data.slice(0, 3));")


def test_overview_renders_a_cell_per_head_and_a_fragment_shows_that_heads_maps(report, browser, tmp_path):
    from matplotlib import colormaps

    path, attentions = report
    b, l, h = 1, 1, 2
    browser.get(path.as_uri() + f"#ex{b}-l{l}-h{h}")
    for ex in range(2):
        cells = browser.find_elements("css selector", f".overview[data-example='{ex}'] a.cell")
        assert len(cells) == LAYERS * HEADS
        assert sorted((int(c.get_attribute("data-layer")), int(c.get_attribute("data-head"))) for c in cells) == \
            [(i, j) for i in range(LAYERS) for j in range(HEADS)]
        assert all(c.size["width"] >= 20 and c.size["height"] >= 15 for c in cells)  # laid out, not collapsed
    detail = _wait_for_head(browser, b, l, h)
    assert detail.find_element("css selector", "h3").text.startswith(f"Layer {l}, head {h}: not identifiable")
    kinds = [c.get_attribute("data-kind") for c in detail.find_elements("css selector", "canvas")]
    assert kinds == ["raw", "effective", "witness"]
    selected = browser.find_elements("css selector", f".overview[data-example='{b}'] a.cell.sel")
    assert [(s.get_attribute("data-layer"), s.get_attribute("data-head")) for s in selected] == [(str(l), str(h))]

    # the values the page decodes are this head's attention (independent reference: the forward pass's weights) ...
    n = LENGTHS[b]
    data = json.loads(browser.execute_script(f"return document.getElementById('ex{b}-data').textContent;"))
    top = data["maps"][l * HEADS + h]["top"]  # the head's scale (its raw map's and witness's max), 255 in uint8
    shown = np.array(browser.execute_script(f"return window.identifiabilityReport.decode({b}, {l}, {h}, 'a');"))
    ref = attentions[l][b, h, :n, :n].double().numpy()
    np.testing.assert_allclose(shown.reshape(n, n), ref, atol=top / 510 + 1e-6)
    # ... and the canvas is painted with them: cell (i, j) in viridis at A[i, j] / the head's scale
    canvas = detail.find_element("css selector", "canvas[data-kind='raw']")
    width = int(canvas.get_attribute("width"))
    cell = max(8, min(16, 320 // n))  # a labelled map (n <= 40): canvas width = label margin + n cells
    margin = width - n * cell
    for i, j in ((0, 0), (3, 7), (n - 1, n - 2)):
        expected = np.round(np.array(colormaps["viridis"](round(255 * ref[i, j] / top) / 255))[:3] * 255)
        got = _pixel(browser, b, "raw", margin + j * cell + cell // 2, i * cell + cell // 2)
        np.testing.assert_allclose(got, expected, atol=3)
    browser.save_screenshot(str(tmp_path / "detail.png"))


def test_clicking_an_identifiable_head_shows_no_witness_and_the_picker_recolours(report, browser):
    from selenium.webdriver.support.ui import Select

    path, _ = report
    browser.get(path.as_uri())
    b, l, h = 0, 0, 1
    browser.find_element("css selector", f".overview[data-example='{b}'] a.cell[data-layer='{l}'][data-head='{h}']"
                         ).click()
    detail = _wait_for_head(browser, b, l, h)
    assert browser.execute_script("return location.hash;") == f"#ex{b}-l{l}-h{h}"  # linkable
    assert [c.get_attribute("data-kind") for c in detail.find_elements("css selector", "canvas")] == ["raw",
                                                                                                      "effective"]
    assert "no witness" in detail.text and "identifiable" in detail.find_element("css selector", "h3").text
    # the explainers' strips sit under the head's maps
    rows = browser.find_elements("css selector", f"#ex{b}-detail tr[data-explainer]")
    assert len(rows) >= 5 and all(r.is_displayed() for r in rows)

    heads = json.loads(Path(path.parent / "report.json").read_text())["heads"]
    Select(browser.find_element("css selector", f"select.measure[data-example='{b}']")).select_by_value("null_dim")
    for cell in browser.find_elements("css selector", f".overview[data-example='{b}'] a.cell"):
        la, he = int(cell.get_attribute("data-layer")), int(cell.get_attribute("data-head"))
        [record] = [r for r in heads if (r["example"], r["layer"], r["head"]) == (b, la, he)]
        assert cell.text == str(record["null_dim"])
