"""`edgerun serve` driven by clients nobody here wrote: the `openai` SDK on the OpenAI images
route, `requests` on the AUTOMATIC1111 routes, and Debian's Chromium (through Selenium and
chromedriver) on the page at `/`. Run by `scripts/test-serve`, which starts the server:

    python tests/serve/clients.py BASE_URL CLI_PNG SCREENSHOT

BASE_URL is the server (http://127.0.0.1:PORT), CLI_PNG the image `edgerun generate` made for
the demo prompt with seed 42 and 20 steps at 64x64, SCREENSHOT where the browser's screenshot
goes. Exits 1 on the first failed check.
"""

import base64
import io
import json
import sys
import threading
import time

import requests
from openai import OpenAI, BadRequestError

PROMPT = "a large red circle on a blue background"


def png_pixels(data):
    """RGB pixels of an 8-bit RGB PNG (no Pillow needed): (width, height, rows)."""
    import struct
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    i, idat, w, h, ctype = 8, b"", 0, 0, 0
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        kind, body = data[i + 4 : i + 8], data[i + 8 : i + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8, "not 8-bit"
        elif kind == b"IDAT":
            idat += body
        i += 12 + n
    bpp = {2: 3, 6: 4}[ctype]
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp : x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


def is_red(p):
    r, g, b = p
    return r > g + 60 and r > b + 60


def is_blue(p):
    r, g, b = p
    return b > r + 60 and b > g + 30


def check_openai(base, cli_png):
    client = OpenAI(base_url=base + "/v1", api_key="unused")
    r = client.images.generate(
        model="demo",
        prompt=PROMPT,
        n=2,
        size="64x64",
        response_format="b64_json",
        extra_body={"seed": 42, "steps": 20, "cfg_scale": 4.5, "negative_prompt": ""},
    )
    assert len(r.data) == 2, r
    first = base64.b64decode(r.data[0].b64_json)
    assert first == cli_png, "openai: the image differs from edgerun generate's bytes"
    assert base64.b64decode(r.data[1].b64_json) != first, "openai: n=2 gave the same image twice"
    try:
        client.images.generate(model="demo", prompt=PROMPT, size="1024x1024")
        raise AssertionError("openai: a size not in the plan was accepted")
    except BadRequestError as e:
        assert "64x64" in str(e) and "size" in str(e), e
    print("ok: openai SDK (images.generate, n=2, same bytes as the CLI; 400 naming the sizes)")


def check_a1111(base, cli_png):
    s = requests.Session()
    samplers = s.get(base + "/sdapi/v1/samplers").json()
    assert [x["name"] for x in samplers][:3] == ["DPM++ 2M", "Euler", "Euler a"], samplers
    models = s.get(base + "/sdapi/v1/sd-models").json()
    assert models[0]["filename"] == "demo.plan", models
    body = {"prompt": PROMPT, "negative_prompt": "", "steps": 20, "cfg_scale": 4.5, "width": 64,
            "height": 64, "seed": 42, "sampler_name": "DPM++ 2M", "batch_size": 1, "n_iter": 1,
            "restore_faces": False, "styles": []}
    r = s.post(base + "/sdapi/v1/txt2img", json=body)
    assert r.status_code == 200, r.text
    j = r.json()
    assert base64.b64decode(j["images"][0]) == cli_png, "txt2img: differs from the CLI's bytes"
    info = json.loads(j["info"])
    assert info["seed"] == 42 and info["all_seeds"] == [42], info
    assert "Sampler: DPM++ 2M" in info["infotexts"][0], info
    # seed -1: a random seed, reported.
    r = s.post(base + "/sdapi/v1/txt2img", json=dict(body, seed=-1, steps=4)).json()
    assert json.loads(r["info"])["seed"] != 42
    # Progress while a long job runs, then interrupt it.
    out = {}
    long = dict(body, steps=150, width=128, height=128)
    t = threading.Thread(target=lambda: out.update(r=s.post(base + "/sdapi/v1/txt2img", json=long)))
    t.start()
    seen = None
    for _ in range(3000):
        p = requests.get(base + "/sdapi/v1/progress").json()
        if p["state"]["sampling_step"] > 0:
            seen = p
            break
        time.sleep(0.01)
    assert seen is not None, "progress never showed a step"
    assert 0 < seen["progress"] < 1 and seen["state"]["sampling_steps"] == 150, seen
    assert requests.post(base + "/sdapi/v1/interrupt").status_code == 200
    t.join()
    assert out["r"].status_code == 409 and "interrupted" in out["r"].json()["detail"], out["r"].text
    bad = requests.post(base + "/sdapi/v1/txt2img", data=b"{\"steps\": ", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["detail"], bad.text
    assert requests.get(base + "/health").json()["status"] == "ok"
    print("ok: requests on /sdapi/v1 (txt2img same bytes as the CLI, seed -1, progress, interrupt, samplers, sd-models, 400)")


def check_page(base, screenshot):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=900,1000"]:
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        drv.get(base + "/")
        assert "edgerun" in drv.title, drv.title
        prompt = drv.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys(PROMPT)
        seed = drv.find_element(By.ID, "seed")
        seed.clear()
        seed.send_keys("42")
        drv.find_element(By.ID, "go").click()
        WebDriverWait(drv, 120).until(
            lambda d: d.find_element(By.ID, "result").get_attribute("data-loaded") == "1"
            or d.find_element(By.ID, "error").text)
        err = drv.find_element(By.ID, "error").text
        assert not err, "page error: " + err
        status = drv.find_element(By.ID, "status").text
        assert "seed 42" in status, status
        img = drv.find_element(By.ID, "result")
        rect = img.rect
        png = drv.get_screenshot_as_png()
        with open(screenshot, "wb") as f:
            f.write(png)
    finally:
        drv.quit()
    # The image as the browser drew it: a red centre, blue corners.
    w, h, rows = png_pixels(png)
    dpr = w / 900
    x0, y0 = rect["x"] * dpr, rect["y"] * dpr
    side = rect["width"] * dpr
    at = lambda fx, fy: rows[int(y0 + fy * side)][int(x0 + fx * side)]
    assert is_red(at(0.5, 0.5)), ("screenshot centre not red", at(0.5, 0.5), rect)
    assert is_blue(at(0.05, 0.05)) and is_blue(at(0.95, 0.95)), ("corners not blue", at(0.05, 0.05), at(0.95, 0.95))
    print(f"ok: Chromium loaded the page, submitted the prompt and shows the image (screenshot {screenshot})")


def main():
    base, cli, shot = sys.argv[1], sys.argv[2], sys.argv[3]
    cli_png = open(cli, "rb").read()
    check_openai(base, cli_png)
    check_a1111(base, cli_png)
    check_page(base, shot)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAILED:", e, file=sys.stderr)
        sys.exit(1)
