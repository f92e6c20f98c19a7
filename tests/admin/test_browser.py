"""nsqadmin's UI in a real headless Chromium (Debian's chromium and chromium-driver, driven by selenium) against a
real cluster: every page loads and shows the numbers the nodes' /stats give, the pause, empty, delete and tombstone
buttons change the brokers and lookupd, charts gain points from successive samples, and the health strip names a
node that does not answer. A screenshot of each main page is saved under the module's tmp dir (their paths are
printed: ``pytest -s`` shows them).

One cluster, one nsqadmin and one browser serve the whole module; each test keeps to its own topics.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.admin.admin_wire import (DEADLINE, http_name, node_channel, node_stats, node_topic, on_lookupd,
                                    q, request)
from tests.broker.wire import consumer, producer, unique

from selenium import webdriver  # noqa: E402  (the test extra installs it)
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):  # CI installs them (.ci/run): missing there is a failure, not a skip
        raise RuntimeError("chromium and chromium-driver are not installed, though .ci/run installs them")
    pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them)", allow_module_level=True)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000"]


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(DEADLINE)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def admin(cluster, admin_factory):
    return admin_factory(f"--lookupd-http-address={cluster.lookupd.http}", "--base-path=/ops")



@pytest.fixture(scope="module")
def busy(cluster):
    """A topic on both nodes (4 + 3 messages), channel "ch" with a consumer (RDY 0) on node 1."""
    n1, n2 = cluster.nodes
    topic = unique("ui")
    producer(n1.address, topic, *[b"m"] * 4)
    producer(n2.address, topic, *[b"m"] * 3)
    c = consumer(n1.address, topic, "ch", user_agent="browser-test/2.0", feature_negotiation=True)
    on_lookupd(cluster, topic, 2)
    yield topic, c
    c.close()


def wait(driver, cond, what, timeout=DEADLINE):
    def safe(d):
        try:
            return cond(d)
        except StaleElementReferenceException:  # the page redrew between finding and reading
            return False
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(safe, message=what)


def click(driver, by, selector, what):
    """Click an element found afresh at each try: the page redraws every sample, so an element found a moment
    earlier can be gone (stale) when it is clicked."""
    def clicked(d):
        d.find_element(by, selector).click()
        return True
    wait(driver, clicked, what)


def number(text: str) -> int:
    return int(text.replace(",", "").split("+")[0].strip())


def cell(driver, table, row_attr, field):
    return driver.find_element(By.CSS_SELECTOR, f"#{table} tr[{row_attr}] td[data-field='{field}']").text


def open_page(driver, admin, path):
    driver.get(f"{admin.url}/ops/{path}")
    wait(driver, lambda d: d.execute_script("return document.readyState") == "complete", "page loaded")


def accept_confirm(driver):
    def alert(d):
        try:
            return d.switch_to.alert
        except NoAlertPresentException:
            return False
    wait(driver, alert, "the confirm dialog").accept()


def shot(driver, shots, name):
    path = shots / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    assert path.stat().st_size > 1000


def test_topics_page_lists_the_cluster_topics(browser, admin, busy, shots, cluster):
    topic, _ = busy
    open_page(browser, admin, "")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"#topics tr[data-topic='{topic}']"), "topic listed")
    wait(browser, lambda d: "2/2 nodes answering" in d.find_element(By.ID, "health").text, "health strip")
    shot(browser, shots, "topics")
    click(browser, By.CSS_SELECTOR, f"#topics tr[data-topic='{topic}'] a", "the topic's link")  # in-page navigation
    wait(browser, lambda d: d.find_element(By.ID, "topic-name").text == topic, "the topic page")
    assert browser.current_url == f"{admin.url}/ops/topics/{topic}"


def test_topic_page_shows_the_nodes_numbers_and_a_growing_chart(browser, admin, busy, shots, cluster):
    topic, _ = busy
    n1, n2 = cluster.nodes
    open_page(browser, admin, f"topics/{q(topic)}")

    def totals_match(d):
        want = sum(node_topic(n, topic)["message_count"] for n in cluster.nodes)
        return number(cell(d, "topic-nodes", "data-node='*'", "message_count")) == want
    wait(browser, totals_match, "the total row's messages")
    for n in cluster.nodes:
        own = node_topic(n, topic)
        row = f"data-node='{http_name(n)}'"
        assert number(cell(browser, "topic-nodes", row, "message_count")) == own["message_count"]
        assert number(cell(browser, "topic-nodes", row, "depth")) == own["depth"]
    own_ch = node_channel(n1, topic, "ch")
    assert number(cell(browser, "topic-channels", "data-channel='ch'", "depth")) >= own_ch["depth"]
    points = lambda d: int(d.find_element(By.CSS_SELECTOR, "[data-chart='publish_rate'] canvas")  # noqa: E731
                           .get_attribute("data-points"))
    start = points(browser)
    producer(n2.address, topic, *[b"more"] * 20)
    wait(browser, lambda d: points(d) >= start + 2, "the publish-rate chart gained points")
    wait(browser, lambda d: number(cell(d, "topic-nodes", "data-node='*'", "message_count")) ==
         sum(node_topic(n, topic)["message_count"] for n in cluster.nodes), "new messages counted")
    shot(browser, shots, "topic")


def test_channel_page_shows_clients_and_charts(browser, admin, busy, shots, cluster):
    topic, _ = busy
    n1 = cluster.nodes[0]
    open_page(browser, admin, f"topics/{q(topic)}/ch")
    own = node_channel(n1, topic, "ch")
    [client] = own["clients"]
    row = f"#channel-clients tr[data-client='{client['remote_address']}']"
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), "the client row")
    text = browser.find_element(By.CSS_SELECTOR, row).text
    assert "browser-test/2.0" in text and http_name(n1) in text
    assert number(browser.find_element(By.CSS_SELECTOR, f"{row} td[data-field='ready_count']").text) == \
        client["ready_count"]
    total = sum(c["depth"] for c in (node_channel(n, topic, "ch") for n in cluster.nodes) if c)
    wait(browser, lambda d: number(cell(d, "channel-nodes", "data-node='*'", "depth")) == total, "channel depth")
    wait(browser, lambda d: int(d.find_element(By.CSS_SELECTOR, "[data-chart='depth'] canvas")
                                .get_attribute("data-points")) >= 2, "the depth chart gained points")
    shot(browser, shots, "channel")


def test_nodes_node_and_counter_pages(browser, admin, busy, shots, cluster):
    topic, _ = busy
    open_page(browser, admin, "nodes")
    wait(browser, lambda d: d.find_element(By.ID, "node-count").text == "2", "both nodes listed")
    for n in cluster.nodes:
        assert browser.find_elements(By.CSS_SELECTOR, f"#nodes tr[data-node='{http_name(n)}']")
    shot(browser, shots, "nodes")
    n1 = cluster.nodes[0]
    click(browser, By.CSS_SELECTOR, f"#nodes tr[data-node='{http_name(n1)}'] a", "the node's link")
    wait(browser, lambda d: d.find_elements(By.ID, "total-messages"), "the node page")
    want = sum(t["message_count"] for t in node_stats(n1)["topics"])
    assert number(browser.find_element(By.ID, "total-messages").text) == want
    assert browser.find_elements(By.CSS_SELECTOR, f"#node-topics tr[data-topic='{topic}']")
    open_page(browser, admin, "counter")

    def counted(d):
        want = sum(c["message_count"] for n in cluster.nodes for t in node_stats(n)["topics"] for c in t["channels"])
        text = d.find_element(By.ID, "counter").text
        return text != "-" and number(text) == want
    wait(browser, counted, "the counter shows the cluster's message count")
    wait(browser, lambda d: int(d.find_element(By.CSS_SELECTOR, "[data-chart='message_rate'] canvas")
                                .get_attribute("data-points")) >= 2, "the counter chart gained points")
    shot(browser, shots, "counter")


def test_buttons_pause_empty_tombstone_and_delete(browser, admin, cluster):
    n1, n2 = cluster.nodes
    topic = unique("click")
    producer(n1.address, topic, b"1", b"2")
    producer(n2.address, topic, b"3")
    on_lookupd(cluster, topic, 2)
    open_page(browser, admin, f"topics/{q(topic)}")
    wait(browser, lambda d: d.find_element(By.ID, "action-pause").text == "Pause Topic", "the pause button")
    click(browser, By.ID, "action-pause", "the action-pause button")
    accept_confirm(browser)
    wait(browser, lambda d: all(node_topic(n, topic)["paused"] for n in cluster.nodes), "paused on both nodes")
    wait(browser, lambda d: d.find_element(By.ID, "action-pause").text == "UnPause Topic", "the unpause button")
    click(browser, By.ID, "action-pause", "the action-pause button")
    accept_confirm(browser)
    wait(browser, lambda d: not any(node_topic(n, topic)["paused"] for n in cluster.nodes), "unpaused")
    click(browser, By.ID, "action-empty", "the action-empty button")
    accept_confirm(browser)
    wait(browser, lambda d: all(node_topic(n, topic)["depth"] == 0 for n in cluster.nodes), "emptied")
    wait(browser, lambda d: number(cell(d, "topic-nodes", "data-node='*'", "depth")) == 0, "depth 0 shown")
    click(browser, By.CSS_SELECTOR, f"button[data-tombstone='{http_name(n2)}']", "n2's tombstone")
    accept_confirm(browser)
    wait(browser, lambda d: node_topic(n2, topic) is None, "the topic deleted on the tombstoned node")
    wait(browser, lambda d: cluster.lookupd.producer_ports(topic) == [n1.port], "only n1 a producer in lookupd")
    wait(browser, lambda d: d.find_elements(By.ID, "action-delete"), "the delete button")
    click(browser, By.ID, "action-delete", "the action-delete button")
    accept_confirm(browser)
    wait(browser, lambda d: node_topic(n1, topic) is None, "the topic deleted")
    wait(browser, lambda d: d.current_url == f"{admin.url}/ops/topics", "back on the topics page")
    assert topic not in cluster.lookupd.get_json("/topics")["topics"]


def test_channel_buttons(browser, admin, cluster):
    n1 = cluster.nodes[0]
    topic = unique("chan")
    producer(n1.address, topic, b"1", b"2")
    consumer(n1.address, topic, "c").close()
    producer(n1.address, topic, b"3")
    on_lookupd(cluster, topic, 1)
    open_page(browser, admin, f"topics/{q(topic)}/c")
    wait(browser, lambda d: d.find_element(By.ID, "action-pause").text == "Pause Channel", "the pause button")
    click(browser, By.ID, "action-pause", "the action-pause button")
    accept_confirm(browser)
    wait(browser, lambda d: node_channel(n1, topic, "c")["paused"], "channel paused")
    wait(browser, lambda d: d.find_element(By.ID, "action-pause").text == "UnPause Channel", "unpause shown")
    click(browser, By.ID, "action-empty", "the action-empty button")
    accept_confirm(browser)
    wait(browser, lambda d: node_channel(n1, topic, "c")["depth"] == 0, "channel emptied")
    click(browser, By.ID, "action-delete", "the action-delete button")
    accept_confirm(browser)
    wait(browser, lambda d: node_channel(n1, topic, "c") is None, "channel deleted")
    wait(browser, lambda d: d.current_url == f"{admin.url}/ops/topics/{topic}", "back on the topic page")


def test_lookup_page_creates_and_lists_inactive(browser, admin, cluster):
    topic = unique("look")
    open_page(browser, admin, "lookup")
    wait(browser, lambda d: d.find_elements(By.ID, "create-topic"), "the create form")
    browser.find_element(By.ID, "create-topic").send_keys(topic)
    browser.find_element(By.ID, "create-channel").send_keys("later")
    click(browser, By.ID, "create-submit", "the create-submit button")
    wait(browser, lambda d: topic in cluster.lookupd.get_json("/topics")["topics"], "created in lookupd")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"#inactive li[data-topic='{topic}'] "
                                                             "li[data-channel='later']"), "listed as inactive")
    click(browser, By.CSS_SELECTOR, f"button[data-delete-topic='{topic}']", "the delete")
    accept_confirm(browser)
    wait(browser, lambda d: topic not in cluster.lookupd.get_json("/topics")["topics"], "deleted in lookupd")


def test_health_strip_names_a_node_that_does_not_answer(browser, admin_factory, cluster, shots):
    dead = "127.0.0.1:1"
    direct = admin_factory(f"--nsqd-http-address={http_name(cluster.nodes[0])}", f"--nsqd-http-address={dead}")
    browser.get(f"{direct.url}/nodes")
    wait(browser, lambda d: f"down: {dead}" in d.find_element(By.ID, "health").text, "the down node in the strip")
    assert "1/2 nodes answering" in browser.find_element(By.ID, "health").text
    wait(browser, lambda d: dead in d.find_element(By.ID, "warning").text, "the warning names it")
    shot(browser, shots, "health")


def test_channel_page_shows_policies_only_where_there_are_some(browser, admin, cluster):
    """nsqpy's policies (issue 49): a table of the counters and the effective policy per node, none for a channel
    without a policy on any node."""
    n1, n2 = cluster.nodes
    topic = unique("bpol")
    status, _, body = request(n1.http_address, "POST", f"/channel/config?topic={q(topic)}&channel=ch",
                              json.dumps({"max_attempts": 4}).encode())
    assert status == 200, body
    for n in cluster.nodes:
        producer(n.address, topic, b"x")
        consumer(n.address, topic, "ch").close()
        consumer(n.address, topic, "plain").close()
    on_lookupd(cluster, topic, 2)
    open_page(browser, admin, f"topics/{q(topic)}/ch")
    row = f"#channel-policies tr[data-node='{http_name(n1)}'] td[data-field='policy']"
    wait(browser, lambda d: "max_attempts=4" in d.find_element(By.CSS_SELECTOR, row).text, "node 1's policy")
    assert number(cell(browser, "channel-policies", f"data-node='{http_name(n1)}'", "dead_lettered_count")) == 0
    assert not browser.find_elements(By.CSS_SELECTOR, f"#channel-policies tr[data-node='{http_name(n2)}']")
    open_page(browser, admin, f"topics/{q(topic)}/plain")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#channel-nodes tr[data-node='*']"), "the page")
    assert not browser.find_elements(By.ID, "channel-policies")
