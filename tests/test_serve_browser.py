"""hlbl serve's page in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium; nothing is downloaded at run time): type a context and see the model's top words, sample a
continuation, search a word and see its path highlighted in the tree. Saves a screenshot."""

import os
import shutil
import socket
import threading
import time

import pytest

from hlbl.serve import Service, create_app


def _find(*names):
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


CHROMIUM = _find("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVER = _find("chromedriver", "chromium-driver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="no chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def server(tiny_run):
    """``hlbl serve``'s application on a free localhost port, in a thread."""
    import uvicorn

    run, _, _ = tiny_run
    service = Service.load(run)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(service), log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", service
    srv.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1300",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=DriverService(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def wait_for(driver, condition, what, timeout=30.0):
    """``condition(driver)`` once it is true; elements replaced while it looks (the list is redrawn
    on every answer) make it look again."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(
        driver,
        timeout,
        poll_frequency=0.05,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    )
    try:
        return wait.until(condition)
    except TimeoutException:
        logs = ""
        try:
            logs = "; ".join(e["message"] for e in driver.get_log("browser"))
        except Exception:
            pass
        shown = shown_words(driver)
        raise AssertionError(
            f"timed out waiting for {what} (the page shows {shown}; browser console: {logs or 'empty'})"
        ) from None


def shown_words(driver):
    from selenium.webdriver.common.by import By

    return [li.get_attribute("data-word") for li in driver.find_elements(By.CSS_SELECTOR, "#predictions li")]


def test_the_page_predicts_as_you_type_and_finds_a_word_in_the_tree(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    url, service = server
    browser.get(url + "/")
    wait_for(browser, lambda d: shown_words(d) == service.predict("", 10)["words"], "the sentence-start predictions")
    assert "words" in browser.find_element(By.ID, "model-line").text

    # Type a context: the list turns into the model's top 10 for it, best first, with bars.
    box = browser.find_element(By.ID, "context")
    box.send_keys("the big")
    want = service.predict("the big", 10)
    wait_for(browser, lambda d: shown_words(d) == want["words"], f"the top words after 'the big': {want['words']}")
    bars = browser.find_elements(By.CSS_SELECTOR, "#predictions li .bar span")
    widths = [b.size["width"] for b in bars]
    assert len(widths) == 10 and widths[0] > 0 and widths == sorted(widths, reverse=True)
    probs = [li.text.split()[-1] for li in browser.find_elements(By.CSS_SELECTOR, "#predictions li")]
    assert probs[0] == f"{100 * want['probs'][0]:.1f}%"

    # The decisions on the way to the top word: one row per node of its path, with P(left).
    top = want["words"][0]
    path = service.path(service.context_ids("the big")[0], top)["paths"][0]
    wait_for(
        browser,
        lambda d: (
            d.find_element(By.ID, "path-word").text == top
            and len(d.find_elements(By.CSS_SELECTOR, "#decisions table.path tr")) == len(path["nodes"]) + 1
        ),
        "the decision table of the top word",
    )
    cells = browser.find_elements(By.CSS_SELECTOR, "#decisions table.path tr:nth-child(2) td")
    assert cells[1].text == f"#{path['nodes'][0]}" and cells[2].text == f"{path['p_left'][0]:.3f}"

    # A sampled continuation appears.
    browser.find_element(By.ID, "sample").click()
    wait_for(browser, lambda d: len(d.find_element(By.ID, "sample-out").text.split()) > 2, "a sampled continuation")
    assert browser.find_element(By.ID, "sample-out").text.startswith("the big")

    # Search a word: every node on its path opens and is highlighted, and so is its leaf.
    word = "fish"
    codes = service.word(word)["codes"]
    search = browser.find_element(By.ID, "search")
    search.send_keys(word)
    browser.find_element(By.ID, "search-go").click()
    want_nodes = sorted({str(n) for c in codes for n in c["nodes"]})
    wait_for(
        browser,
        lambda d: (
            sorted(r.get_attribute("data-node") for r in d.find_elements(By.CSS_SELECTOR, ".row.onpath")) == want_nodes
        ),
        f"the path of {word!r} highlighted (nodes {want_nodes})",
    )
    found = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".row.leaf.found"), f"the leaf of {word!r}")
    assert [f.get_attribute("data-word") for f in found] == [word] * len(codes)
    assert found[0].is_displayed()
    assert f"depth {codes[0]['depth']}" in browser.find_element(By.ID, "search-msg").text
    code_text = browser.find_element(By.ID, "codes").text
    assert "".join("L" if b else "R" for b in codes[0]["bits"]) in code_text

    # An unknown word says so instead of highlighting anything.
    search.clear()
    search.send_keys("zebra")
    browser.find_element(By.ID, "search-go").click()
    wait_for(
        browser,
        lambda d: "not in the vocabulary" in d.find_element(By.ID, "search-msg").text,
        "the unknown-word message",
    )

    # Nothing the page did raised a JavaScript error (the 404 of the unknown word is logged, and expected).
    errors = [
        e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "/v1/tree/word/zebra" not in e["message"]
    ]
    assert not errors, errors

    shot = tmp_path / "serve_page.png"
    search.clear()
    search.send_keys(word)
    browser.find_element(By.ID, "search-go").click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".row.leaf.found"), "the leaf again")
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
    keep = os.environ.get("HLBL_SCREENSHOT")
    if keep:  # a copy where a person asked for it
        shutil.copyfile(shot, keep)
