"""Table of the real datasets: which files, where they come from, and how each is verified.

Provenance for every file is in shared/data/SOURCES.md. Pinned SHA-256 values were computed from
the copies in shared/data, which SOURCES.md checked against the original data. Where the official
bytes are known to differ from our copy (the MNIST .gz files were re-gzipped, so only their
decompressed content matches LeCun's), the check is the md5 of the decompressed content instead,
so that both our copy and an official download verify. `fetch.py` does the downloading.
"""

from __future__ import annotations

import dataclasses

from mpi_dp.errors import DataError


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset.

    name: file name in the cache (cache/DATASET/name) and in a mirror (MIRROR/DATASET/name).
    url: exact upstream URL, or None when it cannot be downloaded automatically (see `manual`).
    sha256: pinned hex digest of the file's bytes, or None (not pinned).
    content_md5: pinned md5 of the gunzipped content (.gz files whose bytes differ upstream).
    shared_path: path of our verified copy relative to shared/data (to build a local mirror).
    manual: how to obtain the file by hand and where to put it, when `url` is None.
    size: size in bytes of the pinned file (progress display and listings).
    alt: other accepted SHA-256 digests (e.g. a known re-packing of the same content).
    licence, note: terms of use and provenance of this file.
    """

    name: str
    url: str | None
    sha256: str | None
    content_md5: str | None = None
    shared_path: str | None = None
    manual: str | None = None
    size: int | None = None
    alt: tuple[str, ...] = ()
    licence: str = ""
    note: str = ""

    @property
    def pinned(self) -> bool:
        """True when some digest (sha256, alt or content md5) is fixed in the table."""
        return bool(self.sha256 or self.alt or self.content_md5)

    @property
    def check(self) -> str:
        """Short label of the verification applied: 'sha256', 'content-md5' or 'unpinned'."""
        kinds = [k for k, v in (("sha256", self.sha256 or self.alt), ("content-md5", self.content_md5)) if v]
        return "+".join(kinds) or "unpinned"


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A named dataset: its files, a one-line description, licence and provenance note."""

    name: str
    files: tuple[RemoteFile, ...]
    description: str
    licence: str
    note: str

    def file(self, name: str) -> RemoteFile:
        """The file called `name`; DataError listing the dataset's files if unknown."""
        for f in self.files:
            if f.name == name:
                return f
        raise DataError(f"dataset {self.name!r} has no file {name!r}; files: {[f.name for f in self.files]}")


def _raw(repo: str, commit: str, path: str) -> str:
    """Exact raw.githubusercontent.com URL of `path` in `repo` at `commit`."""
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


# ----------------------------------------------------------------------------------------------
# Lending Club

_LC_LICENCE = "Lending Club public loan data; no licence stated by the uploaders"
_LENDING = Dataset(
    name="lending",
    description="Lending Club loans: 39,786-loan LoanStats3a subset (16 columns) and the first 2,433 rows "
    "of the Kaggle 2007-2018 file (145 columns, with int_rate)",
    licence=_LC_LICENCE,
    note="Full originals: Lending Club's LoanStats3a.csv (2007-2011) and Kaggle "
    "https://www.kaggle.com/datasets/wendykan/lending-club-loan-data (login required). The files here "
    "are exact GitHub snapshots at fixed commits (SOURCES.md).",
    files=(
        RemoteFile(
            name="LoanStats3a_DaylanSit_16col.csv",
            url=_raw("DaylanSit/ML-Loan-Prediction", "ce40313b14e06b2b302e6eb8f10e932a1004f059",
                     "LoanStats3a.csv"),
            sha256="30577c795ee7c85dc600329dd7c25395a83751496cfe7f23678582366ec5d8a5",
            shared_path="lending_club/LoanStats3a_DaylanSit_16col.csv",
            size=3_719_929,
            licence=_LC_LICENCE,
            note="DaylanSit/ML-Loan-Prediction LoanStats3a.csv (blob 28bba481...): 39,786 rows x 16 "
            "columns, loans meeting the credit policy; no int_rate, grade, fico or dti.",
        ),
        RemoteFile(
            name="loan_kaggle2018_first2433rows.csv",
            url=_raw("JulianneZech/loans-ml", "cc966aaf85e4d21fccfa0cb8213a8944eb9cce09", "loan.csv"),
            sha256="0dcbe19c96a9ad7801390aaab53e5864c0f85c298d5bee5c025e30c44614c6e6",
            shared_path="lending_club/loan_kaggle2018_first2433rows.csv",
            size=1_277_568,
            licence=_LC_LICENCE,
            note="JulianneZech/loans-ml loan.csv (blob b8693236...): first 2,433 rows x 145 columns of "
            "Kaggle wendykan lending-club-loan-data (all issue_d Dec-2018).",
        ),
    ),
)

# ----------------------------------------------------------------------------------------------
# Credit card fraud (ULB)

_CC_LICENCE = "ODbL (ULB Machine Learning Group / Worldline); the snapshot repository has no LICENSE"
_CREDITCARD = Dataset(
    name="creditcard",
    description="Credit card fraud (ULB): contiguous prefix of creditcard.csv, 3,065 rows x 31 columns, "
    "2 frauds (pipeline smoke tests only)",
    licence=_CC_LICENCE,
    note="Full original (284,807 rows, ~150 MB): https://www.kaggle.com/datasets/mlg-ulb/creditcardfraud "
    "(login required); put it in the cache by hand if needed.",
    files=(
        RemoteFile(
            name="creditcard_first3065rows.csv",
            url=_raw("krantirk/Credit-GANS", "c6f2fa45c787d49003a9737d6da1955deba76ec6", "creditcard1.csv"),
            sha256="563ed5ea310fd415c708202b5a68f1463be0f391ac982efedd089988c5202cea",
            shared_path="creditcard_fraud/creditcard_first3065rows.csv",
            size=1_621_533,
            licence=_CC_LICENCE,
            note="krantirk/Credit-GANS creditcard1.csv: Time 0..2623, row 0 identical to the original.",
        ),
    ),
)

# ----------------------------------------------------------------------------------------------
# NY SPARCS 2020 musculoskeletal subset

_SPARCS_LICENCE = "NY State DOH open data (health.data.ny.gov terms of use)"
_SPARCS = Dataset(
    name="sparcs",
    description="NY SPARCS 2020 inpatient discharges, musculoskeletal course subset: 36,631 rows x 28 "
    "columns, 169 facilities (Permanent.Facility.Id), Total.Costs, los",
    licence=_SPARCS_LICENCE,
    note="Course-made subset (SDSU PH700A), not the 2015 file of the seed paper; Facility Name, Age Group "
    "and Type of Admission were dropped. Full SPARCS de-identified files: https://health.data.ny.gov "
    "(Hospital Inpatient Discharges (SPARCS De-Identified)).",
    files=(
        RemoteFile(
            name="week10_df_musc_skel.csv.gz",
            url=_raw("tperez7091/sdsu.ph700a", "d7acc4e541a78eaa553b8af4e655eabbd317efdc",
                     "data/sparcs/week10_df_musc_skel.csv.gz"),
            sha256="fc1a72b08eeacbf7c8227f697ecfc3697b46e25d1577cd8977812bf24b02a5e9",
            shared_path="sparcs2020_musculoskeletal/week10_df_musc_skel.csv.gz",
            size=1_294_165,
            licence=_SPARCS_LICENCE,
            note="tperez7091/sdsu.ph700a at d7acc4e5 (deleted from HEAD later).",
        ),
    ),
)

# ----------------------------------------------------------------------------------------------
# MNIST

_MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
_MNIST_LICENCE = "LeCun, Cortes & Burges; no formal licence, commonly treated as CC BY-SA 3.0"
# (file, size of our copy, sha256 of our copy (documentation only), md5 of the decompressed content,
#  md5 of the official .gz as used by torchvision)
_MNIST_FILES = (
    ("train-images-idx3-ubyte.gz", 9_719_438,
     "0b367032e93c5d0cea0925647cfdb18614af8ee15f83e6f2fc2ad904a6835971",
     "6bbc9ace898e44ae57da46a324031adb", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
    ("train-labels-idx1-ubyte.gz", 28_881,
     "ec02e7948609e5754d47881c09b8afdd8dfa60600b9e5388c8c54a67069ec772",
     "a25bea736e30d166cdddb491f175f624", "d53e105ee54ea40749a09fcbcd1e9432"),
    ("t10k-images-idx3-ubyte.gz", 1_648_877,
     "167310007f03058885c7e95e6c0b19c20de5c7fd3031f4cbdadc9014a523d80b",
     "2646ac647ad5339dbf082846283269ea", "9fb629c4189551a2d022fa330f9573f3"),
    ("t10k-labels-idx1-ubyte.gz", 4_542,
     "fc607395669ec21321ea83e4b82c0544b7e8e63ff5b34337c06bc0a17cc0da3c",
     "27ae3e4e09519cfbb04c329615203637", "ec29112dd5afa0611ce80d1b7f02629c"),
)
_MNIST = Dataset(
    name="mnist",
    description="MNIST handwritten digits, full 60,000 train + 10,000 test, IDX format gzipped",
    licence=_MNIST_LICENCE,
    note="Official files from yann.lecun.com/exdb/mnist, served by the S3 mirror torchvision uses "
    f"({_MNIST_URL}). Checked by md5 of the decompressed content: our copies were re-gzipped (and "
    "train-images rebuilt losslessly from ConvNetJS sprites), so their .gz bytes differ from the "
    "official ones while the content is identical.",
    files=tuple(
        RemoteFile(
            name=name,
            url=_MNIST_URL + name,
            sha256=None,
            content_md5=content_md5,
            shared_path=f"mnist/{name}",
            licence=_MNIST_LICENCE,
            note=f"official .gz md5 {gz_md5} (torchvision); our re-gzipped copy: {size:,} bytes, "
            f"sha256 {our_sha}",
        )
        for name, size, our_sha, content_md5, gz_md5 in _MNIST_FILES
    ),
)

# ----------------------------------------------------------------------------------------------
# FEMNIST (LEAF, 5% sample, partial)

_FEMNIST_LICENCE = "LEAF code BSD-2-Clause; images from NIST Special Database 19; leaf-torch has no LICENSE"
_FEMNIST_MANUAL = (
    "FEMNIST has no official single-file download. The pinned archive is the project's partial copy "
    "of the LEAF 5% sample (all 35 test shards, 20 of 35 train shards, from slz-ai/leaf-torch at "
    "5a94e3b721bf5920a25d59d800481380602b7862, data/femnist/data/{train,test}/*_niid_05_keep_0_*_9.json): "
    "get it from a data mirror (--mirror). To rebuild a sample yourself: git clone "
    "https://github.com/TalwalkarLab/leaf; cd leaf/data/femnist; "
    "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample --tf 0.9 (downloads NIST SD19, several GB); then "
    "tar -cJf femnist_leaf_sf0.05_partial.tar.xz --transform 's,^data,femnist,' data/train data/test. "
    "A rebuilt archive has different bytes (LEAF samples at random), so it will not match the pinned "
    "SHA-256; read its JSON files directly instead."
)
_FEMNIST = Dataset(
    name="femnist",
    description="FEMNIST (LEAF, --sf 0.05 niid, 0.9 train fraction), PARTIAL: train 105 users / 14,708 "
    "samples, test 184 users / 4,088 samples, 784 floats per image, 62 classes",
    licence=_FEMNIST_LICENCE,
    note="LEAF: https://github.com/TalwalkarLab/leaf (FEMNIST from NIST SD19 by writer). Archive layout: "
    "femnist/{train,test}/all_data_*_niid_05_keep_0_{train,test}_9.json.",
    files=(
        RemoteFile(
            name="femnist_leaf_sf0.05_partial.tar.xz",
            url=None,
            sha256="09de0aad346788676e244439eec450e704175c7df11650731594d039b942ffd1",
            shared_path="femnist_leaf_sf0.05_partial.tar.xz",
            manual=_FEMNIST_MANUAL,
            size=3_245_840,
            licence=_FEMNIST_LICENCE,
            note="tar.xz of LEAF JSON shards from slz-ai/leaf-torch (deleted from that repository later).",
        ),
    ),
)

# ----------------------------------------------------------------------------------------------
# Reuters-21578 (LaSVM binary split, LIBSVM format)

_REUTERS_LICENCE = "tick-datasets BSD-3-Clause; Reuters-21578 free for research use"
_TICK = ("X-DataInitiative/tick-datasets", "05d934beb18c60386c0050a14d3ffb9517cac8ab")
_REUTERS = Dataset(
    name="reuters",
    description="Reuters-21578 binary (LaSVM split), LIBSVM format, bz2: train 7,770 x 8,315, "
    "test 3,299 x 8,315 (a substitute for RCV1)",
    licence=_REUTERS_LICENCE,
    note="Original: Bottou's lasvm-reuters (https://leon.bottou.org/projects/lasvm); tick removed "
    "duplicate feature entries from the train set.",
    files=(
        RemoteFile(
            name="reuters.trn.bz2",
            url=_raw(*_TICK, "binary/reuters/reuters.trn.bz2"),
            sha256="e77a3368662c02caebe0d9cbcc97d856019bcfb33a8e9b7c48e0b51ee4cdfb60",
            shared_path="reuters21578_lasvm_tick/reuters.trn.bz2",
            size=3_107_267,
            licence=_REUTERS_LICENCE,
            note="train: 7,770 rows, +1 in 538",
        ),
        RemoteFile(
            name="reuters.tst.bz2",
            url=_raw(*_TICK, "binary/reuters/reuters.tst.bz2"),
            sha256="3d699b9644a38160bf3228059d18fbfc07474057d8e82d512576a2b82d72e211",
            shared_path="reuters21578_lasvm_tick/reuters.tst.bz2",
            size=763_856,
            licence=_REUTERS_LICENCE,
            note="test: 3,299 rows, +1 in 179",
        ),
    ),
)

# ----------------------------------------------------------------------------------------------
# MovieLens 100K

_ML_LICENCE = (
    "GroupLens terms: research use only, cite Harper & Konstan 2015, NO redistribution without "
    "permission, no commercial use (never commit or mirror publicly)"
)
_MOVIELENS = Dataset(
    name="movielens",
    description="MovieLens 100K: 100,000 ratings, 943 users, 1,682 items (ml-100k folder, zip)",
    licence=_ML_LICENCE,
    note="Official: https://grouplens.org/datasets/movielens/100k/. Not pinned: the project only holds a "
    "re-packed tar.xz (ml-100k.tar.xz), so the SHA-256 of the official zip is recorded on first fetch "
    "(MANIFEST.json) and checked on later fetches.",
    files=(
        RemoteFile(
            name="ml-100k.zip",
            url="https://files.grouplens.org/datasets/movielens/ml-100k.zip",
            sha256=None,
            licence=_ML_LICENCE,
            note="u.data md5 of the genuine 100,000-rating file: 6e47046882bad158b0efbb84cd5cb987",
        ),
    ),
)

DATASETS: dict[str, Dataset] = {
    d.name: d for d in (_LENDING, _CREDITCARD, _SPARCS, _MNIST, _FEMNIST, _REUTERS, _MOVIELENS)
}


def get(name: str) -> Dataset:
    """The dataset called `name`; DataError listing the known names if there is none."""
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}") from None
