# The walk's steps shared by the compiled walks (accelerated.pyx over libxml2's nodes,
# lexbor_walk.pyx over lexbor's): what an element's start and end do to the ``Page`` being built.
# walk.py's ``py_walk`` is the reference; the vocabularies, paragraph scores and ``Page`` come from
# blocks.py, as its do. Each walk reads its tree's nodes, names and attributes and calls these.
from tokenmill.transforms.deadline import check

from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from libc.stdint cimport uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy

from tokenmill.transforms.extract import hints as _hints_module
from tokenmill.transforms.extract.hints import F_BOILERPLATE, F_POSITIVE, F_UNLIKELY, UNLIKELY_ARTICLE_RE, hints

from tokenmill.transforms.extract import blocks

cdef object _INLINE = blocks.INLINE
cdef object _JUNK = blocks.JUNK
cdef object _HEADINGS = blocks.HEADINGS
cdef object _CHROME = blocks.CHROME_TAGS
cdef object _HIDDEN_CLASSES = blocks.HIDDEN_CLASSES
cdef object _UNLIKELY_ROLES = blocks.UNLIKELY_ROLES
cdef object _POSITIVE_ITEMPROP = blocks.POSITIVE_ITEMPROP
cdef object _is_hidden_style = blocks.is_hidden_style
assert blocks.BR == "\0"  # the byte the runs of text carry
cdef int _LENGTH_CAP = blocks.LENGTH_CAP
cdef object _Page = blocks.Page


# What walk.py's sets say of a tag, as bits (one lookup per tag name and page).
cdef enum:
    K_INLINE = 1
    K_HEADING = 2
    K_CHROME = 4
    K_BR = 8
    K_A = 16
    K_PRE = 32
    K_SEMANTIC = 64  # article, main: never unlikely for their own hints
    K_JUNK = 128

# What an element's start tells the walk to do with its subtree.
cdef enum:
    SKIP = 0  # not entered (junk, hidden, boilerplate inline); its tail still comes
    ENTER = 1  # entered, its text first
    ENTER_BARE = 2  # a <br>: entered, no text of its own


# ---- hints.py's ``hints``, compiled for ASCII names (the reference answers the others)
#
# hints.py classifies each class name by five vocabularies of literals (anywhere in the
# lower-cased name) and words (a whole token of it): five regex searches a name, and most names
# are new to each site. Here every literal is tried at each position of the name and every word
# against each token, in C; the answers equal the reference's (tests/test_html.py).

cdef enum:
    MAX_LITERALS = 256
    MAX_NAME = 256  # longer names: the reference

cdef char[MAX_LITERALS][32] _lit
cdef Py_ssize_t[MAX_LITERALS] _lit_len
cdef int[MAX_LITERALS] _lit_bits
cdef bint[MAX_LITERALS] _lit_word  # a word (a whole token), else a literal (anywhere)
cdef Py_ssize_t[257] _first  # the entries starting with byte c: _first[c] to _first[c + 1]
cdef bint _compiled_hints = True


def _load_vocabularies():
    global _compiled_hints
    entries = {}
    for bit, words in _hints_module.VOCABULARIES:
        for lit in words.literals:
            entries[(lit, False)] = entries.get((lit, False), 0) | bit
        for word in words.words:
            entries[(word, True)] = entries.get((word, True), 0) | bit
    ordered = sorted(entries.items(), key=lambda e: e[0][0].encode())
    usable = len(ordered) <= MAX_LITERALS and all(
        t.isascii() and t == t.lower() and not any(ch.isdigit() for ch in t) and 1 < len(t) < 32
        for (t, _), _ in ordered)  # (digit runs need no collapsing: no entry holds a digit)
    if not usable:
        _compiled_hints = False
        return
    cdef Py_ssize_t i, c
    for i, ((text, word), bits) in enumerate(ordered):
        raw = text.encode()
        for c in range(len(raw)):
            _lit[i][c] = raw[c]
        _lit_len[i] = len(raw)
        _lit_bits[i] = bits
        _lit_word[i] = word
    i = 0
    for c in range(257):
        while i < len(ordered) and c < 256 and (<unsigned char>_lit[i][0]) < c:
            i += 1
        _first[c] = i if c < 256 else len(ordered)


_load_vocabularies()


cdef inline bint _separator(unsigned char c):
    """[\\s_-] of hints.py's token split, on ASCII (str.isspace's ASCII characters)."""
    return c == 32 or (9 <= c <= 13) or (28 <= c <= 31) or c == 95 or c == 45


cdef int _name_bits(const unsigned char* name, Py_ssize_t n, unsigned char* low):
    """hints.py's _name_hints of an ASCII name of n < MAX_NAME bytes."""
    cdef Py_ssize_t i, j, k, start
    cdef int bits = 0
    cdef unsigned char c
    for i in range(n):
        c = name[i]
        low[i] = c + 32 if 65 <= c <= 90 else c
    for i in range(n):  # literals anywhere
        c = low[i]
        for k in range(_first[c], _first[c + 1]):
            if (not _lit_word[k] and _lit_len[k] <= n - i and _lit[k][1] == low[i + 1]  # (2+ bytes each)
                    and memcmp(low + i, _lit[k], _lit_len[k]) == 0):
                bits |= _lit_bits[k]
    i = 0
    while i < n:  # words: whole tokens
        while i < n and _separator(low[i]):
            i += 1
        start = i
        while i < n and not _separator(low[i]):
            i += 1
        if i > start:
            c = low[start]
            for k in range(_first[c], _first[c + 1]):
                if _lit_word[k] and _lit_len[k] == i - start and memcmp(low + start, _lit[k], i - start) == 0:
                    bits |= _lit_bits[k]
    return bits


cdef Py_ssize_t _pieces(const unsigned char* s, Py_ssize_t n):
    """len(re.split(r"[\\s_-]+", s)) of an ASCII string."""
    cdef Py_ssize_t i = 0, pieces = 1
    while i < n:
        if _separator(s[i]):
            pieces += 1
            while i < n and _separator(s[i]):
                i += 1
        else:
            i += 1
    return pieces


cdef tuple _TAXONOMY = _hints_module.TAXONOMY_PREFIXES
# hints.py's ``combine`` of every (class bits, id bits, long id): the vocabularies' five bits.
cdef enum:
    HINT_BITS = 5
cdef int[1 << (2 * HINT_BITS + 1)] _COMBINED_UNLIKELY
cdef int[1 << (2 * HINT_BITS + 1)] _COMBINED_WEIGHT
assert all(bit < (1 << HINT_BITS) for bit, _ in _hints_module.VOCABULARIES)
for _i in range(1 << (2 * HINT_BITS + 1)):
    _COMBINED_UNLIKELY[_i], _COMBINED_WEIGHT[_i] = _hints_module.combine(
        _i & ((1 << HINT_BITS) - 1), (_i >> HINT_BITS) & ((1 << HINT_BITS) - 1), bool(_i >> (2 * HINT_BITS)))


cdef int _class_bits(str cls):
    """The hint bits of a class attribute's names (hints.py's ``hints``, taxonomy names left
    out), compiled; -1 where the reference must answer (a name not ASCII, or too long)."""
    cdef Py_ssize_t n
    cdef const char* s
    cdef int bits = 0
    cdef unsigned char low[MAX_NAME]  # the name lower-cased (on the stack: no state between calls)
    if not (_compiled_hints and cls.isascii()):
        return -1
    for name in cls.split():
        if not (<str>name).startswith(_TAXONOMY):
            s = PyUnicode_AsUTF8AndSize(name, &n)
            if n >= MAX_NAME:
                return -1
            bits |= _name_bits(<const unsigned char*>s, n, low)
    return bits


cdef int _id_bits(const unsigned char* s, Py_ssize_t n):
    """The hint bits of an id of n UTF-8 bytes, and 1 << HINT_BITS for a long one (four or more
    pieces, with bits); -1 where the reference must answer (not ASCII, or too long)."""
    cdef unsigned char low[MAX_NAME]
    cdef Py_ssize_t i
    cdef int bits
    if not _compiled_hints or n >= MAX_NAME:
        return -1
    for i in range(n):
        if s[i] >= 0x80:
            return -1
    bits = _name_bits(s, n, low)
    if bits and _pieces(s, n) >= 4:
        bits |= 1 << HINT_BITS
    return bits


cdef inline tuple _combined(int class_bits, int id_bits):
    cdef int i = class_bits | (id_bits << HINT_BITS)
    return _COMBINED_UNLIKELY[i], _COMBINED_WEIGHT[i]


def class_table():
    """(values, their bytes) in the class table (for the tests of its bounds)."""
    return _seen_count, _seen_bytes


def compiled_hints(str cls, str id_):
    """The compiled ``hints`` (for the tests against hints.py's)."""
    cdef Py_ssize_t n
    cdef const char* s
    cdef int class_bits = _class_bits(cls), id_bits = 0
    if id_:
        if not id_.isascii():  # (the walk's ids are UTF-8 bytes: _id_bits refuses them there)
            return hints(cls, id_)
        s = PyUnicode_AsUTF8AndSize(id_, &n)
        id_bits = _id_bits(<const unsigned char*>s, n)
    if class_bits < 0 or id_bits < 0:
        return hints(cls, id_)
    return _combined(class_bits, id_bits)


cdef int _kind(str tag):
    return ((K_INLINE if tag in _INLINE else 0) | (K_HEADING if tag in _HEADINGS else 0)
            | (K_CHROME if tag in _CHROME else 0) | (K_BR if tag == "br" else 0) | (K_A if tag == "a" else 0)
            | (K_PRE if tag == "pre" else 0) | (K_SEMANTIC if tag in ("article", "main") else 0)
            | (K_JUNK if tag in _JUNK else 0))


# The attributes the walk reads, by slot: each walk keeps an element's first of each (the tree's
# attribute node) and ``start_element`` reads their values through the walk's ``value`` function.
cdef enum:
    A_CLASS = 0
    A_ID = 1
    A_HIDDEN = 2
    A_ARIA_HIDDEN = 3
    A_STYLE = 4
    A_ROLE = 5
    A_ITEMPROP = 6
    N_ATTRIBUTES = 7

ctypedef object (*attribute_value_f)(void* attribute)
# An attribute's value as the tree holds it, UTF-8, without a copy: NULL where it has none in one
# piece (the walk then asks ``attribute_value_f``).
ctypedef const char* (*attribute_bytes_f)(void* attribute, Py_ssize_t* n)
cdef const char* _EMPTY = ""  # an empty value's bytes


cdef inline int _attribute(const char* name, size_t n):
    """The slot of an attribute name the walk reads, else -1."""
    if n == 5:
        return A_CLASS if memcmp(name, b"class", 5) == 0 else A_STYLE if memcmp(name, b"style", 5) == 0 else -1
    if n == 2:
        return A_ID if memcmp(name, b"id", 2) == 0 else -1
    if n == 6:
        return A_HIDDEN if memcmp(name, b"hidden", 6) == 0 else -1
    if n == 11:
        return A_ARIA_HIDDEN if memcmp(name, b"aria-hidden", 11) == 0 else -1
    if n == 4:
        return A_ROLE if memcmp(name, b"role", 4) == 0 else -1
    if n == 8:
        return A_ITEMPROP if memcmp(name, b"itemprop", 8) == 0 else -1
    return -1


cdef inline void _keep_first(void** slots, const char* name, size_t n, void* attribute):
    cdef int slot = _attribute(name, n)
    if slot >= 0 and slots[slot] is NULL:
        slots[slot] = attribute


cdef inline Py_ssize_t _space(const unsigned char* s, Py_ssize_t i, Py_ssize_t n):
    """The length in bytes of the character at s[i] if str.isspace() says it is, else 0."""
    cdef unsigned char c = s[i]
    if c < 0x80:
        return 1 if c == 32 or 9 <= c <= 13 or 28 <= c <= 31 else 0
    if c == 0xC2:  # U+0085, U+00A0
        return 2 if i + 1 < n and (s[i + 1] == 0x85 or s[i + 1] == 0xA0) else 0
    if i + 2 >= n:
        return 0
    if c == 0xE1:  # U+1680
        return 3 if s[i + 1] == 0x9A and s[i + 2] == 0x80 else 0
    if c == 0xE2:  # U+2000-200A, U+2028, U+2029, U+202F; U+205F
        if s[i + 1] == 0x80:
            return 3 if 0x80 <= s[i + 2] <= 0x8A or s[i + 2] == 0xA8 or s[i + 2] == 0xA9 or s[i + 2] == 0xAF else 0
        return 3 if s[i + 1] == 0x81 and s[i + 2] == 0x9F else 0
    if c == 0xE3:  # U+3000
        return 3 if s[i + 1] == 0x80 and s[i + 2] == 0x80 else 0
    return 0


# What a class attribute says, read once per distinct value: its str (the Page keeps it),
# whether it hides the element, its hint bits (-1: hints.py answers). Pages reuse their values
# (every item of a list) and sites theirs: one table per process, open addressing on the value's
# bytes, emptied when it holds MAX_CLASSES values or MAX_CLASS_BYTES of them (values longer than
# MAX_CACHED are read each time): with their strs (up to 4 bytes a character) and the slots, under
# 15 MB whatever the pages (each compiled module has its own). Only C touches it (no
# Python call between a look-up and its use, nor inside an insertion): a thread switch cannot
# find it half-changed.
cdef struct ClassEntry:
    uint64_t hash
    char* key  # the value's bytes (owned), NULL: a free slot
    Py_ssize_t n
    PyObject* cls  # owned
    int hidden
    int bits

cdef enum:
    MAX_CLASSES = 1 << 15
    MAX_CLASS_BYTES = 1 << 21
    MAX_CACHED = 1024

cdef ClassEntry* _seen = NULL
cdef Py_ssize_t _seen_cap = 0, _seen_count = 0, _seen_bytes = 0


cdef inline uint64_t _fnv1a(const char* s, Py_ssize_t n):
    cdef uint64_t h = 14695981039346656037ULL
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ <unsigned char>s[i]) * 1099511628211ULL
    return h


cdef inline ClassEntry* _slot(ClassEntry* table, Py_ssize_t cap, uint64_t h, const char* s, Py_ssize_t n):
    """The entry of the value ``s``, or the free slot where it goes."""
    cdef ClassEntry* e = &table[h & (cap - 1)]
    while e.key is not NULL and not (e.hash == h and e.n == n and memcmp(e.key, s, n) == 0):
        e = &table[(e - table + 1) & (cap - 1)]
    return e


cdef int _remember(uint64_t h, const char* s, Py_ssize_t n, str cls, int hidden, int bits) except -1:
    global _seen, _seen_cap, _seen_count, _seen_bytes
    cdef Py_ssize_t i, cap
    cdef ClassEntry* grown
    cdef ClassEntry* e
    if n > MAX_CACHED:
        return 0
    if _seen_count >= MAX_CLASSES or _seen_bytes + n > MAX_CLASS_BYTES:
        for i in range(_seen_cap):
            if _seen[i].key is not NULL:
                free(_seen[i].key)
                Py_XDECREF(_seen[i].cls)
                _seen[i].key = NULL
        _seen_count = _seen_bytes = 0
    if 2 * (_seen_count + 1) > _seen_cap:
        cap = max(256, 2 * _seen_cap)
        grown = <ClassEntry*>calloc(cap, sizeof(ClassEntry))
        if grown is NULL:
            raise MemoryError()
        for i in range(_seen_cap):
            if _seen[i].key is not NULL:
                _slot(grown, cap, _seen[i].hash, _seen[i].key, _seen[i].n)[0] = _seen[i]
        free(_seen)
        _seen, _seen_cap = grown, cap
    e = _slot(_seen, _seen_cap, h, s, n)
    if e.key is not NULL:
        return 0
    key = <char*>malloc(n if n else 1)
    if key is NULL:
        raise MemoryError()
    memcpy(key, s, n)
    Py_INCREF(cls)
    e.hash, e.key, e.n, e.cls, e.hidden, e.bits = h, key, n, <PyObject*>cls, hidden, bits
    _seen_count += 1
    _seen_bytes += n
    return 0


cdef str _class_of(void* attribute, attribute_value_f value, attribute_bytes_f raw, int* hidden, int* bits):
    """An element's class attribute, whether it hides the element and its hint bits."""
    cdef Py_ssize_t n = 0
    cdef const char* s = raw(attribute, &n)
    cdef uint64_t h = 0
    cdef ClassEntry* e
    if s is not NULL and _seen_cap:
        h = _fnv1a(s, n)
        e = _slot(_seen, _seen_cap, h, s, n)
        if e.key is not NULL:
            hidden[0], bits[0] = e.hidden, e.bits
            return <str>e.cls
    cls = PyUnicode_DecodeUTF8(s, n, NULL) if s is not NULL else value(attribute)
    hidden[0] = not _HIDDEN_CLASSES.isdisjoint(cls.split())
    bits[0] = _class_bits(cls)
    if s is not NULL:
        _remember(_fnv1a(s, n), s, n, cls, hidden[0], bits[0])
    return cls


cdef class _Walk:
    cdef char* buf  # the current run of text, UTF-8 (<br> and <pre> line breaks as BR's NUL)
    cdef Py_ssize_t buf_len, buf_cap, out_cap
    cdef char* out  # flush's output
    cdef object pg, tags, parents, ends, weights, flags, classes
    cdef object b_text, b_node, b_len, b_link, b_commas, b_points
    cdef Py_ssize_t link_len, n_br, pre_depth, cur, count
    cdef dict names
    cdef list stack, open_blocks, open_links  # open block nodes; their tree nodes; open <a> nodes
    cdef size_t block_el, skipping  # the innermost open block's tree node; the subtree skipped
    cdef double deadline

    def __cinit__(self, double deadline):
        pg = self.pg = _Page()
        self.tags, self.parents, self.ends = pg.tag, pg.parent, pg.end
        self.weights, self.flags, self.classes = pg.weight, pg.flags, pg.cls
        self.b_text, self.b_node, self.b_len, self.b_link = pg.b_text, pg.b_node, pg.b_len, pg.b_link
        self.b_commas, self.b_points = pg.b_commas, pg.b_points
        self.buf = self.out = NULL
        self.buf_len = self.buf_cap = self.out_cap = 0
        self.link_len = self.n_br = self.pre_depth = self.count = 0
        self.cur = -1
        self.names = {}  # tag name key of the tree -> (tag, kind bits)
        self.stack, self.open_blocks, self.open_links = [], [], []
        self.block_el = self.skipping = 0
        self.deadline = deadline

    cdef inline void tick(self):
        self.count += 1
        if not self.count & 255:
            check(self.deadline)

    def __dealloc__(self):
        free(self.buf)
        free(self.out)

    cdef int put(self, const char* t, Py_ssize_t n) except -1:
        """Bytes onto the current run, as they are."""
        cdef Py_ssize_t cap
        cdef char* grown
        if self.buf_len + n > self.buf_cap:
            cap = max(2 * self.buf_cap, self.buf_len + n, 4096)
            grown = <char*>realloc(self.buf, cap)
            if grown is NULL:
                raise MemoryError()
            self.buf, self.buf_cap = grown, cap
        memcpy(self.buf + self.buf_len, t, n)
        self.buf_len += n
        return 0

    cdef int add(self, const char* t, Py_ssize_t n) except -1:
        """UTF-8 text (or tail) into the current run; <pre> keeps its line breaks (as BR)."""
        cdef Py_ssize_t i, start = self.buf_len
        self.put(t, n)
        if self.pre_depth:
            for i in range(start, start + n):
                if self.buf[i] == 10:
                    self.buf[i] = 0
        if self.open_links:
            for i in range(n):  # characters: every byte but UTF-8's continuation bytes
                if (<unsigned char>t[i]) & 0xC0 != 0x80:
                    self.link_len += 1
        return 0

    cdef int flush(self) except -1:
        """The run of text so far as a block, as py_walk's flush makes it: whitespace collapsed
        (str.split()'s whitespace), one line per <br>-broken line (empty lines dropped); its
        length, link share, prose commas and paragraph points (blocks.py), in one pass over
        the UTF-8 bytes."""
        cdef Py_ssize_t i = 0, n_in = self.buf_len, o = 0, line_start = 0, ws, chars = 0
        cdef Py_ssize_t n = 0, commas = 0, line_chars = 0, line_commas = 0, points = 0
        cdef unsigned char* src = <unsigned char*>self.buf
        cdef unsigned char* out
        cdef bint pending = False
        for i in range(n_in):  # characters, <br> marks included (as len() counts them)
            chars += src[i] & 0xC0 != 0x80
        cdef Py_ssize_t raw_len = chars - self.n_br
        cdef Py_ssize_t ln = self.link_len
        self.link_len = self.n_br = self.buf_len = 0
        if self.out_cap < n_in:
            free(self.out)
            self.out = <char*>malloc(n_in)
            self.out_cap = n_in if self.out is not NULL else 0
            if self.out is NULL:
                raise MemoryError()
        out = <unsigned char*>self.out
        i = 0
        while i < n_in:  # " ".join(line.split()) of each line, the lines with words joined by "\n"
            if src[i] == 0:  # BR
                if o > line_start:
                    out[o] = 10
                    o += 1
                    line_start = o
                pending = False
                i += 1
                continue
            ws = _space(src, i, n_in)
            if ws:
                pending = o > line_start
                i += ws
                continue
            if pending:
                out[o] = 32
                o += 1
                pending = False
            out[o] = src[i]
            o += 1
            i += 1
        if o and out[o - 1] == 10:
            o -= 1
        if o == 0:
            return 0
        i = 0
        while i <= o:  # each line's characters, commas and points
            if i == o or out[i] == 10:
                n += line_chars + (i < o)
                commas += line_commas
                if line_chars >= 25:
                    points += 2 + line_commas + min(line_chars // 100, _LENGTH_CAP)
                line_chars = line_commas = 0
                i += 1
                continue
            line_chars += out[i] & 0xC0 != 0x80
            if out[i] == 0x2C:  # ", "
                line_commas += i + 1 < o and out[i + 1] == 32
            elif out[i] == 0xEF:  # "，"
                line_commas += i + 2 < o and out[i + 1] == 0xBC and out[i + 2] == 0x8C
            elif out[i] == 0xE3:  # "、"
                line_commas += i + 2 < o and out[i + 1] == 0x80 and out[i + 2] == 0x81
            elif out[i] == 0xD8:  # "، "
                line_commas += i + 2 < o and out[i + 1] == 0x8C and out[i + 2] == 32
            i += 1
        self.b_text.append(PyUnicode_DecodeUTF8(self.out, o, NULL))
        self.b_node.append(self.cur)
        self.b_len.append(n)
        self.b_link.append(n * ln / raw_len if ln else 0.0)
        self.b_commas.append(commas)
        self.b_points.append(points)
        return 0

    cdef int skip(self, size_t node):
        self.skipping = node
        return SKIP

    cdef int start_element(self, size_t node, str tag, int kind, void** slots, attribute_value_f value,
                           attribute_bytes_f raw):
        """An element's start, given its attributes by slot (NULL where absent; a heading's id is
        not read: it is an anchor made of its text): SKIP, ENTER or ENTER_BARE."""
        cdef int unlikely = 0, weight = 0, flag = 0, class_bits = 0, id_bits = 0, hidden = 0
        cdef Py_ssize_t i, n = 0
        cdef const char* id_bytes = NULL
        cls = ""
        if slots[A_CLASS] is not NULL:
            cls = _class_of(slots[A_CLASS], value, raw, &hidden, &class_bits)
        if (hidden or slots[A_HIDDEN] is not NULL
                or (slots[A_ARIA_HIDDEN] is not NULL and value(slots[A_ARIA_HIDDEN]) == "true")
                or (slots[A_STYLE] is not NULL and _is_hidden_style(value(slots[A_STYLE])))):
            if self.buf_len and not kind & K_INLINE:
                self.flush()
            return self.skip(node)
        if slots[A_ID] is not NULL and not kind & K_HEADING:
            id_bytes = raw(slots[A_ID], &n)
            id_bits = _id_bits(<const unsigned char*>id_bytes, n) if id_bytes is not NULL else -1
        if (slots[A_CLASS] is not NULL or slots[A_ID] is not NULL and not kind & K_HEADING) and not kind & K_A:
            # (links are never skipped for their names)
            if class_bits >= 0 and id_bits >= 0:
                if class_bits or id_bits:
                    unlikely, weight = _combined(class_bits, id_bits)
            else:
                id_ = value(slots[A_ID]) if slots[A_ID] is not NULL and not kind & K_HEADING else ""
                if cls or id_:
                    unlikely, weight = hints(cls, id_)
        if slots[A_ROLE] is not NULL and value(slots[A_ROLE]) in _UNLIKELY_ROLES:
            unlikely |= F_UNLIKELY
        if slots[A_ITEMPROP] is not NULL and _POSITIVE_ITEMPROP.search(value(slots[A_ITEMPROP])):
            flag |= F_POSITIVE
            weight += 25
            unlikely = 0
        if kind & K_CHROME:
            unlikely |= F_UNLIKELY
        if unlikely and (not self.stack or (kind & K_SEMANTIC and not UNLIKELY_ARTICLE_RE.search(cls))):
            unlikely = 0  # the page itself and semantic content containers are never unlikely
        if kind & K_INLINE:
            if kind & K_BR:
                self.put(b"\0", 1)  # BR
                self.n_br += 1
                return ENTER_BARE
            if unlikely & F_BOILERPLATE:  # e.g. <span class="share-count">
                return self.skip(node)
            if kind & K_A:
                self.open_links.append(node)
            return ENTER
        if self.buf_len:
            self.flush()
        i = len(self.tags)
        self.tags.append(tag)
        self.parents.append(self.cur)
        self.ends.append(i)
        self.weights.append(weight)
        self.flags.append(flag | unlikely)
        self.classes.append(cls)
        self.stack.append(i)
        self.open_blocks.append(node)
        self.block_el = node
        self.cur = i
        if kind & K_PRE:
            self.pre_depth += 1
        return ENTER

    cdef void end(self, size_t node):
        """An element's end (its tail comes after)."""
        if node == self.skipping:
            self.skipping = 0
        elif node == self.block_el:
            if self.buf_len:
                self.flush()
            self.ends[self.cur] = len(self.tags) - 1
            self.stack.pop()
            self.open_blocks.pop()
            if self.tags[self.cur] == "pre":
                self.pre_depth -= 1
            if self.stack:
                self.cur = self.stack[-1]
                self.block_el = self.open_blocks[-1]
            else:
                self.cur = -1
                self.block_el = 0
        elif self.open_links and node == <size_t>self.open_links[-1]:
            self.open_links.pop()

    cdef object finish(self):
        if self.buf_len and self.cur >= 0:
            self.flush()
        return self.pg
