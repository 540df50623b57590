"""--download against a local HTTP server: good, cut, HTML, 404 and failing responses; checksums,
resumed ranges, mirrors, pins, split archives and extraction."""

import dataclasses
import hashlib
import http.server
import io
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from fairseq_sparse.data import download, errors, raw
from fairseq_sparse.data.download import Mirror, RawFile


class Server:
    """A local HTTP server whose paths answer as told: ``routes[path] = (behaviour, body)``."""

    def __init__(self):
        self.routes = {}
        self.requests = []     # (path, Range header or None)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                behaviour, body = server.routes.get(self.path, ("404", b""))
                if behaviour == "404":
                    self.send_error(404, "Not Found")
                    return
                if behaviour.startswith("500x"):       # 500 this many times, then good
                    left = int(behaviour[4:])
                    server.routes[self.path] = (f"500x{left - 1}" if left > 1 else "good", body)
                    self.send_error(500, "Internal Server Error")
                    return
                if behaviour == "cut_once":            # promises everything, sends half, then good
                    server.routes[self.path] = ("good", body)
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                start = 0
                ranged = self.headers.get("Range")
                if ranged and behaviour != "no_range":
                    start = int(ranged.split("=")[1].rstrip("-"))
                    if start >= len(body):
                        self.send_error(416, "Range Not Satisfiable")
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return self.base + path


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch, tmp_path):
    monkeypatch.setattr(download, "BACKOFF_S", 0.0)
    monkeypatch.setattr(download, "TIMEOUT_S", 5)
    monkeypatch.setenv("FAIRSEQ_SPARSE_CACHE", str(tmp_path / "cache"))


def tgz(files: dict) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def mirror(url: str, body: bytes, file: str = None, **kw) -> Mirror:
    kw.setdefault("size", len(body))
    kw.setdefault("sha256", hashlib.sha256(body).hexdigest())
    return Mirror((url,), file or url.rsplit("/", 1)[-1], checksum_from="the test", **kw)


ARCHIVE = tgz({"corpus/train.de": "hallo welt\n" * 2000, "corpus/train.en": "hello world\n" * 2000})


def good_archive(server) -> RawFile:
    """The entry of ARCHIVE served at /a.tgz, with its size and hash."""
    return RawFile("test/a.tgz", (mirror(server.url("/a.tgz"), ARCHIVE),))


def test_good_archive_is_verified_extracted_and_not_fetched_again(server, tmp_path):
    server.routes["/a.tgz"] = ("good", ARCHIVE)
    raw_dir = tmp_path / "raw"
    entry = good_archive(server)
    download.download([entry], raw_dir)
    assert raw.find_raw(raw_dir, "train.en").read_text() == "hello world\n" * 2000
    assert (raw_dir / "a.tgz").read_bytes() == ARCHIVE
    assert not list(raw_dir.glob(".*.part")) and not list(raw_dir.glob(".*.extracting"))
    download.download([entry], raw_dir)
    assert len(server.requests) == 1


def test_cut_body_is_resumed_with_a_range_request(server, tmp_path):
    server.routes["/a.tgz"] = ("cut_once", ARCHIVE)
    raw_dir = tmp_path / "raw"
    download.download([good_archive(server)], raw_dir)
    assert (raw_dir / "a.tgz").read_bytes() == ARCHIVE
    assert server.requests[0][1] is None
    assert server.requests[1][1] == f"bytes={len(ARCHIVE) // 2}-"


def test_server_that_ignores_ranges_restarts_the_file(server, tmp_path):
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    (raw_dir / ".a.tgz.part").write_bytes(b"garbage from an earlier run")
    server.routes["/a.tgz"] = ("no_range", ARCHIVE)
    download.download([good_archive(server)], raw_dir)
    assert (raw_dir / "a.tgz").read_bytes() == ARCHIVE
    assert server.requests[0][1] == "bytes=27-"


def test_server_errors_are_retried(server, tmp_path):
    server.routes["/a.tgz"] = ("500x2", ARCHIVE)
    download.download([good_archive(server)], tmp_path / "raw")
    assert len(server.requests) == 3


def test_every_bad_mirror_is_named_and_nothing_is_left_under_the_final_name(server, tmp_path):
    """404, an HTML page, a wrong hash, a cut archive that passes no check, retried 5xx: one error naming
    every URL and why, and no file under the archive's name."""
    html = b"<!DOCTYPE html><html><body>Please log in</body></html>"
    server.routes["/html/a.tgz"] = ("good", html)
    server.routes["/hash/a.tgz"] = ("good", ARCHIVE[:50] + bytes([ARCHIVE[50] ^ 0xFF]) + ARCHIVE[51:])
    server.routes["/down/a.tgz"] = ("500x99", ARCHIVE)
    mirrors = (mirror(server.url("/gone/a.tgz"), ARCHIVE), mirror(server.url("/html/a.tgz"), ARCHIVE),
               mirror(server.url("/hash/a.tgz"), ARCHIVE), mirror(server.url("/down/a.tgz"), ARCHIVE))
    raw_dir = tmp_path / "raw"
    with pytest.raises(errors.PrepError) as failure:
        download.download([RawFile("test/a.tgz", mirrors)], raw_dir)
    message = str(failure.value)
    assert "\n" not in message and "could not download test/a.tgz" in message
    assert "/gone/a.tgz (HTTP 404" in message
    assert "/html/a.tgz (an HTML page, not a .tgz file)" in message
    assert "/hash/a.tgz (SHA-256" in message and "where the test says" in message
    assert f"/down/a.tgz (HTTP 500, {download.ATTEMPTS} attempts)" in message
    assert not (raw_dir / "a.tgz").exists()
    assert not list(raw_dir.glob(".a.tgz.part"))


def test_next_mirror_is_tried_after_an_archive_that_does_not_extract(server, tmp_path):
    """An archive with no published hash whose body is not a whole archive fails at extraction, is
    deleted and not pinned, and the next mirror gives the file."""
    cut = ARCHIVE[: len(ARCHIVE) // 2]
    server.routes["/bad/a.tgz"] = ("good", cut)
    server.routes["/good/a.tgz"] = ("good", ARCHIVE)
    unpublished = dict(size=None, sha256=None)
    entry = RawFile("test/a.tgz", (mirror(server.url("/bad/a.tgz"), cut, **unpublished),
                                   mirror(server.url("/good/a.tgz"), ARCHIVE, **unpublished)))
    raw_dir = tmp_path / "raw"
    download.download([entry], raw_dir)
    assert raw.find_raw(raw_dir, "train.de").exists()
    assert (raw_dir / "a.tgz").read_bytes() == ARCHIVE
    pins = download._pins()
    assert server.url("/bad/a.tgz") not in pins
    assert pins[server.url("/good/a.tgz")]["sha256"] == hashlib.sha256(ARCHIVE).hexdigest()


def test_unpublished_file_is_pinned_at_its_first_download_and_held_to_it(server, tmp_path):
    server.routes["/train.en"] = ("good", b"hello\n")
    entry = RawFile("test/train.en", (mirror(server.url("/train.en"), b"", size=None, sha256=None),))
    download.download([entry], tmp_path / "one")
    assert (tmp_path / "one" / "train.en").read_bytes() == b"hello\n"
    server.routes["/train.en"] = ("good", b"changed\n")
    with pytest.raises(errors.PrepError, match=r"8 bytes where its first download here .* says 6"):
        download.download([entry], tmp_path / "two")


def test_md5_is_checked_where_it_is_all_that_is_published(server, tmp_path):
    server.routes["/test.tgz"] = ("good", ARCHIVE)
    md5 = hashlib.md5(ARCHIVE).hexdigest()
    good = Mirror((server.url("/test.tgz"),), "test.tgz", md5=md5, checksum_from="sacrebleu")
    download.download([RawFile("test/test.tgz", (good,))], tmp_path / "one")
    wrong = dataclasses.replace(good, md5="0" * 32)
    with pytest.raises(errors.PrepError, match=r"MD5 [0-9a-f]{12}\.\.\. where sacrebleu says 000000000000"):
        download.download([RawFile("test/test.tgz", (wrong,))], tmp_path / "two")


def test_text_file_that_is_an_html_page_is_refused(server, tmp_path):
    server.routes["/train.vi"] = ("good", b"\n  <html><head><title>404</title></head></html>")
    entry = RawFile("test/train.vi", (mirror(server.url("/train.vi"), b"", size=None, sha256=None),))
    with pytest.raises(errors.PrepError, match=r"an HTML page, not a text file"):
        download.download([entry], tmp_path / "raw")
    assert download._pins() == {}


def test_kept_file_that_fails_its_checks_is_set_aside_and_fetched_again(server, tmp_path):
    """The bug this replaces: a poisoned file under the final name was used by every later run."""
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    (raw_dir / "a.tgz").write_bytes(b"<html>Service unavailable</html>")
    server.routes["/a.tgz"] = ("good", ARCHIVE)
    download.download([good_archive(server)], raw_dir)
    assert (raw_dir / "a.tgz").read_bytes() == ARCHIVE
    assert (raw_dir / "a.tgz.rejected").read_bytes() == b"<html>Service unavailable</html>"
    assert raw.find_raw(raw_dir, "train.en").exists()


def test_split_archive_zip_and_local_mirrors(server, tmp_path):
    """Parts of a split archive concatenated; a .zip; a file:// mirror that is missing, then the next."""
    server.routes["/b.tar.gz.00"] = ("good", ARCHIVE[:100])
    server.routes["/b.tar.gz.01"] = ("cut_once", ARCHIVE[100:])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("c/c.ro", "salut\n")
    zipped = buffer.getvalue()
    (tmp_path / "c.zip").write_bytes(zipped)
    split = Mirror((server.url("/b.tar.gz.00"), server.url("/b.tar.gz.01")), "b.tar.gz", len(ARCHIVE),
                   hashlib.sha256(ARCHIVE).hexdigest())
    local = (mirror((tmp_path / "missing.zip").as_uri(), zipped, file="c.zip"),
             mirror((tmp_path / "c.zip").as_uri(), zipped))
    raw_dir = tmp_path / "raw"
    download.download([RawFile("test/b", (split,)), RawFile("test/c", local)], raw_dir)
    assert (raw_dir / "b.tar.gz").read_bytes() == ARCHIVE
    assert raw.find_raw(raw_dir, "c.ro").read_text() == "salut\n"
    assert server.requests[-1] == ("/b.tar.gz.01", f"bytes={(len(ARCHIVE) - 100) // 2}-")


def test_catalogue_names_every_file_of_every_dataset():
    """Each dataset's --download ids are entries of configs/downloads.yaml, each mirror an http(s) URL,
    and every mirror either has a hash (and a size where one is published) with its source, or says why
    it has none."""
    import argparse

    from fairseq_sparse.data import document_corpora, iwslt14_de_en, iwslt15_en_vi, iwslt17_fr_en, wmt

    ids = list(iwslt14_de_en.DOWNLOADS) + list(iwslt15_en_vi.DOWNLOADS) + list(iwslt17_fr_en.DOWNLOADS)
    ids += [i for spec in wmt.DATASETS.values() for i in spec["downloads"]]
    ids += [i for pair in wmt.WMT17_PAIRS for i in wmt.downloads(argparse.Namespace(pair=pair, year=17))]
    ids += [i for c in document_corpora.CORPORA.values() for i in document_corpora.download_ids(c)]
    entries = download.catalogue()
    assert set(ids) == set(entries)
    for entry in entries.values():
        for m in entry.mirrors:
            assert all(p.startswith(("http://", "https://")) for p in m.parts), m
            assert m.sha256 is None or len(m.sha256) == 64, m
            assert m.md5 is None or len(m.md5) == 32, m
            assert (m.sha256 or m.md5) if m.size is not None else True, m
            assert m.checksum_from, f"{entry.id}: {m.url} says nothing about its checksum"


def test_no_space_left_while_extracting_is_one_line_and_keeps_the_archive(server, tmp_path, monkeypatch):
    import errno

    server.routes["/a.tgz"] = ("good", ARCHIVE)

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "extractall", full_disk)
    raw_dir = tmp_path / "raw"
    with pytest.raises(errors.PrepError, match="cannot extract .*a.tgz into .*: No space left on device"):
        download.download([good_archive(server)], raw_dir)
    assert (raw_dir / "a.tgz").read_bytes() == ARCHIVE
    assert not list(raw_dir.glob(".*.extracting"))
    assert Path(raw_dir / ".a.tgz.extracted").exists() is False
