#!/usr/bin/env python3
"""Owns tests/vllm/goldens/{llama3,chatml}.json: the token ids a real vLLM engine gives each
request shape of tests/vllm/corpus.json, so the router's own chat-template rendering and
tokenization can be checked against vLLM's.

    bash tests/vllm/serve.sh llama3 18000 0 0 0 &      # one engine per family
    ~/.cache/router-ci/vllm-0.32.0/bin/python tests/vllm/make_goldens.py \\
        --url http://127.0.0.1:18000 --family llama3

For each shape it asks the engine twice, and records both:
  1. POST /tokenize with the fields vLLM's tokenize API has (vllm/entrypoints/serve/tokenize/
     protocol.py): chat: messages, add_generation_prompt, continue_final_message,
     chat_template_kwargs, tools, add_special_tokens (default false for chat); completions:
     prompt (a string; a list of one string is sent as that string) and add_special_tokens
     (default true). Other body fields are left out (documents is not a /tokenize field: vLLM
     would ignore it; the generation request below renders it).
  2. The body itself on /v1/chat/completions or /v1/completions with max_tokens 1,
     temperature 0 and return_token_ids: the prompt token ids the engine really ran and
     usage.prompt_tokens.
`token_ids` is the generation path's prompt_token_ids when the engine served the body, else the
/tokenize answer; `tokenize_agrees` says whether the two paths gave the same ids. A refused shape
has `token_ids: null` and the engine's status and message in `error`. `rendered` is the ids
detokenized by the engine (POST /detokenize), i.e. the prompt text with special tokens.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHAT_TOKENIZE_FIELDS = (
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "tools",
    "add_special_tokens",
)


def post(url: str, body: dict, timeout: float = 120):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        text = err.read().decode()
        try:
            return err.code, json.loads(text)
        except ValueError:
            return err.code, {"raw": text}


def error_of(status: int, answer: dict) -> dict:
    message = answer.get("error", {}).get("message") if isinstance(answer.get("error"), dict) else None
    return {"status": status, "message": message or answer.get("message") or answer.get("detail") or answer.get("raw")}


def tokenize_request(shape: dict, model: str) -> dict:
    body = shape["body"]
    if shape["endpoint"] == "chat":
        req = {k: body[k] for k in CHAT_TOKENIZE_FIELDS if k in body}
    else:
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        req = {"prompt": prompt}
        if "add_special_tokens" in body:
            req["add_special_tokens"] = body["add_special_tokens"]
    return {"model": model, **req, "return_token_strs": True}


def generation_request(shape: dict, model: str) -> tuple[str, dict]:
    path = "/v1/chat/completions" if shape["endpoint"] == "chat" else "/v1/completions"
    return path, {**shape["body"], "model": model, "max_tokens": 1, "temperature": 0, "return_token_ids": True}


def golden(url: str, model: str, shape: dict) -> dict:
    out = {"name": shape["name"], "endpoint": shape["endpoint"], "body": shape["body"]}
    treq = tokenize_request(shape, model)
    status, tok = post(url + "/tokenize", treq)
    tok_ids = tok.get("tokens") if status == 200 else None
    out["tokenize"] = {"request": treq, "status": status}
    if tok_ids is None:
        out["tokenize"]["error"] = error_of(status, tok)

    path, greq = generation_request(shape, model)
    status, gen = post(url + path, greq)
    out["generate"] = {"path": path, "status": status}
    gen_ids = None
    if status == 200:
        gen_ids = gen.get("prompt_token_ids") or gen["choices"][0].get("prompt_token_ids")
        out["generate"]["prompt_tokens"] = gen["usage"]["prompt_tokens"]
        out["generate"]["cached_tokens"] = (gen["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
    else:
        out["generate"]["error"] = error_of(status, gen)

    ids = gen_ids if gen_ids is not None else tok_ids
    out["token_ids"] = ids
    out["prompt_tokens"] = len(ids) if ids is not None else None
    out["tokenize_agrees"] = None if tok_ids is None or gen_ids is None else tok_ids == gen_ids
    if ids is None:
        out["error"] = out["generate"].get("error") or out["tokenize"].get("error")
    else:
        if tok_ids == ids:
            out["token_strs"] = tok.get("token_strs")
        status, detok = post(url + "/detokenize", {"model": model, "tokens": ids})
        out["rendered"] = detok.get("prompt") if status == 200 else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the engine, http://127.0.0.1:PORT")
    p.add_argument("--family", required=True, choices=["llama3", "chatml"])
    p.add_argument("--model", default="tiny", help="its served model name")
    p.add_argument("--corpus", type=Path, default=HERE / "corpus.json")
    p.add_argument("--out", type=Path, help="default tests/vllm/goldens/FAMILY.json")
    args = p.parse_args()
    url = args.url.rstrip("/")
    with urllib.request.urlopen(url + "/version", timeout=10) as resp:
        version = json.loads(resp.read())["version"]
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        root = json.loads(resp.read())["data"][0]["root"]
    if Path(root).name != args.family:
        sys.exit(f"make_goldens: the engine at {url} serves {root}, not the {args.family} family")

    shapes = json.loads(args.corpus.read_text())
    results = []
    for shape in shapes:
        g = golden(url, args.model, shape)
        results.append(g)
        what = f"{g['prompt_tokens']} tokens" if g["token_ids"] is not None else f"refused {g['error']}"
        agree = {True: "", False: "  (/tokenize DIFFERS from the generation path)", None: ""}[g["tokenize_agrees"]]
        extra = ""
        if g["token_ids"] is not None and g["generate"]["status"] != 200:
            extra = f"  (generation refused: {g['generate']['error']})"
        if g["token_ids"] is not None and g["tokenize"]["status"] != 200:
            extra = f"  (/tokenize refused: {g['tokenize']['error']})"
        print(f"{args.family:7} {g['name']:42} {what}{agree}{extra}"[:400])

    out = args.out or HERE / "goldens" / f"{args.family}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "generated_by": "tests/vllm/make_goldens.py",
        "engine": {"vllm": version, "family": args.family, "model": f"tests/vllm/models/{args.family}"},
        "shapes": results,
    }
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"make_goldens: wrote {out} ({len(results)} shapes)")


if __name__ == "__main__":
    main()
