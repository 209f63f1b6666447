"""Damaged and hostile torch.save files, for tests/interop/test_hostile_pickle.py and the fuzz seed corpus
(tests/fuzz/make_corpus.py). Each builder returns the bytes of a whole .pt file or of a data.pkl.

The files start from a real torch.save archive (zip records archive/data.pkl, archive/data/<key>,
archive/version) and change one thing.
"""
import io
import struct
import zipfile

import torch

PROTO2 = b"\x80\x02"


def torch_save_bytes(obj, protocol=2):
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=protocol)
    return buf.getvalue()


def records(pt):
    """[(name, bytes)] of a .pt archive, in archive order."""
    with zipfile.ZipFile(io.BytesIO(pt)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def data_pkl(pt):
    return next(data for name, data in records(pt) if name.endswith("/data.pkl"))


def zip_records(recs, force_zip64=False):
    """A stored (uncompressed) zip of [(name, bytes)], as torch.save writes them."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in recs:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            with z.open(info, "w", force_zip64=force_zip64) as f:
                f.write(data)
    return buf.getvalue()


def with_data_pkl(pt, pkl):
    """The archive `pt` with its data.pkl replaced by `pkl`."""
    return zip_records([(n, pkl if n.endswith("/data.pkl") else d) for n, d in records(pt)])


def small_state_dict_pt():
    return torch_save_bytes({"w": torch.arange(6, dtype=torch.float32)})


# ---- data.pkl payloads --------------------------------------------------------------------------------

def binunicode(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def deep_marks(levels):
    """((((...)))) as MARK ... TUPLE: 2 bytes a level (200,000 levels: a 400 KB data.pkl)."""
    return PROTO2 + b"(" * levels + b")" + b"t" * levels + b"."


def deep_tuple1(levels):
    """(((),),) as EMPTY_TUPLE TUPLE1 TUPLE1 ...: 1 byte a level, no MARK."""
    return PROTO2 + b")" + b"\x85" * levels + b"."


def deep_memo_lists(levels):
    """[[[...]]] built through the memo: a list is stored, popped, fetched back inside a new MARK/LIST."""
    return PROTO2 + b"]" + b"q\x000(h\x00l" * levels + b"."


def bad_memo():
    """{'w': <memo 7>} where nothing was ever stored under 7."""
    return PROTO2 + b"}" + binunicode("w") + b"h\x07" + b"s."


def self_list():
    """A list appended to itself (l = []; l.append(l))."""
    return PROTO2 + b"]q\x00h\x00a."


def huge_string():
    """BINUNICODE8 declaring 2**62 bytes."""
    return b"\x80\x04\x8d" + struct.pack("<Q", 1 << 62) + b"abc."


def _tensor_pkl(storage_numel, size, stride, offset=0, storage_type="FloatStorage", key="0"):
    """{'w': _rebuild_tensor_v2(storage(key, numel), offset, size, stride, False, OrderedDict())}."""
    def ints(xs):
        out = b"("
        for x in xs:
            out += b"\x8a" + bytes([8]) + struct.pack("<q", x)  # LONG1, 8 bytes
        return out + b"t"
    pid = (b"(" + binunicode("storage") + b"ctorch\n" + storage_type.encode() + b"\n" + binunicode(key) +
           binunicode("cpu") + b"\x8a\x08" + struct.pack("<q", storage_numel) + b"tQ")
    return (PROTO2 + b"}" + binunicode("w") + b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid +
            b"\x8a\x08" + struct.pack("<q", offset) + ints(size) + ints(stride) +
            b"\x89ccollections\nOrderedDict\n)RtR" + b"s.")


def wrapping_view():
    """A 6-element storage viewed with size 2**62 + 1, stride 4: (size - 1) * stride wraps int64 to 0."""
    return _tensor_pkl(6, [(1 << 62) + 1], [4])


def huge_storage():
    """A storage declaring 2**62 float32 elements (2**64 bytes: wraps size_t to 0)."""
    return _tensor_pkl(1 << 62, [2], [1])


def repeated_view():
    """A 6-element storage expanded to 2**40 elements with stride 0 (4 TiB once copied out)."""
    return _tensor_pkl(6, [1 << 20, 1 << 20], [0, 0])


# ---- whole files -------------------------------------------------------------------------------------

def truncated(pt, fraction=0.6):
    return pt[: int(len(pt) * fraction)]


def truncated_pickle_pt():
    pt = small_state_dict_pt()
    pkl = data_pkl(pt)
    return with_data_pkl(pt, pkl[: len(pkl) // 2])


def oversized_record_pt():
    """The central directory says data.pkl is 0xfffffffe bytes (4 GiB); the file holds a few hundred."""
    pt = small_state_dict_pt()
    cd = pt.index(b"PK\x01\x02")  # data.pkl is torch.save's first record
    assert pt[cd + 46:cd + 46 + 16] == b"archive/data.pkl"
    out = bytearray(pt)
    struct.pack_into("<II", out, cd + 20, 0xFFFFFFFE, 0xFFFFFFFE)  # compressed, uncompressed size
    return bytes(out)


def zip64_pt(obj):
    """torch.save's archive rewritten in ZIP64 form (a valid file): 64-bit sizes and offsets in every local
    header and directory record, and the ZIP64 end records, as a > 4 GiB file has them."""
    recs = records(torch_save_bytes(obj))
    limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 0, 0  # what zipfile checks to choose ZIP64 fields
    try:
        return zip_records(recs, force_zip64=True)
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits
