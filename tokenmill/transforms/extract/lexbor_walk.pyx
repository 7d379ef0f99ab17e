# cython: language_level=3
"""Parse with lexbor (selectolax's HTML5 parser) and walk its nodes: the extractor's fast path.

lexbor parses a page in a third of libxml2's time and builds the tree HTML5 browsers build; the
walk reads lexbor's nodes directly (tag names, attributes, text nodes: UTF-8) and makes the same
steps as walk.py's ``py_walk`` (page_walk.pxi). Compiled against the lexbor headers of the very
selectolax release it runs with (setup.py), and used only where that selectolax is the one
installed (tree.py); elsewhere the extractor parses with lxml (tree.py too), which gives the same
text on all but a few malformed pages (bench/MEASUREMENTS.md).
"""

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcmp, memset
from selectolax.lexbor cimport (
    LexborHTMLParser,
    lxb_char_t,
    lxb_dom_attr_local_name_noi,
    lxb_dom_attr_t,
    lxb_dom_attr_value_noi,
    lxb_dom_element_first_attribute_noi,
    lxb_dom_element_qualified_name,
    lxb_dom_element_t,
    lxb_dom_node_t,
    lxb_dom_text_t,
    lxb_html_document_t,
)

import selectolax

include "page_walk.pxi"

# The selectolax this was compiled against: its lexbor's node layout is compiled in.
SELECTOLAX_VERSION = selectolax.__version__

cdef enum:
    ELEMENT_NODE = 1
    TEXT_NODE = 3
    CDATA_SECTION_NODE = 4


cdef inline str _str(const lxb_char_t* s, size_t n):
    return PyUnicode_DecodeUTF8(<const char*>s, n, NULL) if s is not NULL else ""


cdef inline bint _is(const lxb_char_t* s, size_t n, const char* name, size_t m):
    return n == m and memcmp(s, name, m) == 0


cdef object _value(void* attribute):
    cdef size_t n = 0
    cdef const lxb_char_t* s = lxb_dom_attr_value_noi(<lxb_dom_attr_t*>attribute, &n)
    return _str(s, n)


cdef const char* _bytes(void* attribute, Py_ssize_t* n):
    cdef size_t length = 0
    cdef const lxb_char_t* s = lxb_dom_attr_value_noi(<lxb_dom_attr_t*>attribute, &length)
    if s is NULL:
        n[0] = 0
        return _EMPTY
    n[0] = length
    return <const char*>s


cdef tuple _tag(_Walk w, lxb_dom_node_t* n):
    """(the element's name, its kind bits): one lookup per tag id and page."""
    cdef size_t key = <size_t>n.local_name
    cdef size_t length = 0
    cdef const lxb_char_t* s
    hit = w.names.get(key)
    if hit is None:
        s = lxb_dom_element_qualified_name(<lxb_dom_element_t*>n, &length)
        name = _str(s, length)
        hit = w.names[key] = (name, _kind(name))
    return <tuple>hit


cdef inline object _text(lxb_dom_node_t* n):
    cdef lxb_dom_text_t* t = <lxb_dom_text_t*>n
    if t.char_data.data.length == 0:
        return None
    return _str(t.char_data.data.data, t.char_data.data.length)


cdef object _title(lxb_dom_node_t* head):
    """The text of the head's first <title> (as tree.py's ``head/title``), spaces collapsed."""
    cdef lxb_dom_node_t* n = head.first_child if head is not NULL else NULL
    cdef lxb_dom_node_t* c
    cdef size_t length = 0
    cdef const lxb_char_t* s
    while n is not NULL:
        if n.type == ELEMENT_NODE:
            s = lxb_dom_element_qualified_name(<lxb_dom_element_t*>n, &length)
            if _is(s, length, "title", 5):
                parts = []
                c = n.first_child
                while c is not NULL:
                    if c.type == TEXT_NODE:
                        t = _text(c)
                        if t:
                            parts.append(t)
                    c = c.next
                return " ".join("".join(parts).split()) or None
        n = n.next
    return None


def parse_and_walk(bytes data, double deadline):
    """``walk`` of ``data`` (UTF-8) parsed by lexbor."""
    return walk(LexborHTMLParser(data), deadline)


def walk(LexborHTMLParser parsed, double deadline):
    """(title, Page) of a parsed page: its <title>, and walk.walk over its <body> (over the
    <html> element where there is none: a frameset)."""
    cdef lxb_html_document_t* doc = parsed.document
    cdef lxb_dom_node_t* top = <lxb_dom_node_t*>doc.body
    if top is NULL:
        top = <lxb_dom_node_t*>doc.dom_document.element
    title = _title(<lxb_dom_node_t*>doc.head)
    if top is NULL:
        return title, _Page()
    cdef _Walk w = _Walk(deadline)
    cdef lxb_dom_node_t* n = top
    cdef lxb_dom_text_t* text
    cdef lxb_dom_attr_t* a
    cdef void* slots[N_ATTRIBUTES]
    cdef int kind, action
    cdef const lxb_char_t* name
    cdef size_t length = 0
    while True:
        w.tick()
        action = SKIP
        if n.type == TEXT_NODE or n.type == CDATA_SECTION_NODE:
            text = <lxb_dom_text_t*>n
            if text.char_data.data.length:
                w.add(<const char*>text.char_data.data.data, text.char_data.data.length)
        elif n.type == ELEMENT_NODE:
            tag, kind = _tag(w, n)
            if kind & K_JUNK:  # skipped as if it were not there (no line break), its tail kept
                action = w.skip(<size_t>n)
            else:
                memset(slots, 0, sizeof(slots))
                a = lxb_dom_element_first_attribute_noi(<lxb_dom_element_t*>n)
                while a is not NULL:
                    name = lxb_dom_attr_local_name_noi(a, &length)
                    _keep_first(slots, <const char*>name, length, a)
                    a = a.next
                action = w.start_element(<size_t>n, tag, kind, slots, _value, _bytes)
        # (comments and the like: neither entered nor an element's end)
        if action != SKIP and n.first_child is not NULL:
            n = n.first_child
            continue
        # ---- the ends of n and of the ancestors it closes; text nodes come as nodes
        while True:
            if n.type == ELEMENT_NODE:
                w.tick()
                w.end(<size_t>n)
            if n is top:
                return title, w.finish()
            if n.next is not NULL:
                n = n.next
                break
            n = n.parent


# ---------------------------------------------------------------- what is open, before parsing

cdef tuple _UNCOUNTED_NAMES = (
    # void elements, and those whose end tag is optional (the next one closes them; not <option>)
    b"area", b"base", b"br", b"col", b"embed", b"hr", b"img", b"input", b"link", b"meta", b"param",
    b"source", b"track", b"wbr", b"keygen", b"p", b"li", b"dt", b"dd", b"tr", b"td", b"th", b"tbody",
    b"thead", b"tfoot", b"colgroup", b"rp", b"rt", b"caption", b"frame", b"basefont", b"bgsound",
    b"image", b"menuitem")
cdef tuple _FORMATTING_NAMES = (  # (not <a> or <nobr>: a new one closes the last)
    b"b", b"big", b"code", b"em", b"font", b"i", b"s", b"small", b"strike", b"strong", b"tt", b"u")


cdef uint64_t _pack(const unsigned char* s, Py_ssize_t k):
    """A name of at most 8 bytes as one number (lower-cased)."""
    cdef uint64_t v = 0
    cdef Py_ssize_t i
    for i in range(k):
        v = (v << 8) | (s[i] | 32 if 65 <= s[i] <= 90 else s[i])
    return v


cdef uint64_t[64] _UNCOUNTED
cdef uint64_t[16] _FORMATTING
cdef Py_ssize_t _N_UNCOUNTED = len(_UNCOUNTED_NAMES), _N_FORMATTING = len(_FORMATTING_NAMES)
for _i, _name in enumerate(_UNCOUNTED_NAMES):
    _UNCOUNTED[_i] = _pack(_name, len(_name))
for _i, _name in enumerate(_FORMATTING_NAMES):
    _FORMATTING[_i] = _pack(_name, len(_name))
cdef uint64_t _OPTION = _pack(b"option", 6)


cdef inline bint _name_char(unsigned char c):
    return not (c == 9 or c == 10 or c == 12 or c == 13 or c == 32 or c == 47 or c == 62)


cdef inline bint _among(uint64_t packed, uint64_t* names, Py_ssize_t n):
    cdef Py_ssize_t m
    for m in range(n):
        if names[m] == packed:
            return True
    return False


def most_open(const unsigned char[:] data):
    """(elements open at most at once, formatting elements open at most at once, <option>s,
    formatting elements re-opened) in ``data``: upper bounds, from start tags minus end tags of
    the same kind (void elements and those whose end tag is optional not counted as elements; a
    start tag re-opens every open formatting element). tree.py's lexbor limits are on these."""
    cdef Py_ssize_t n = data.shape[0], i = 0, j, k
    cdef Py_ssize_t depth = 0, formatting = 0, options = 0, max_depth = 0, max_formatting = 0, reopened = 0
    cdef const unsigned char* base = &data[0] if n else NULL
    cdef const unsigned char* hit
    cdef unsigned char c
    cdef uint64_t packed
    cdef bint end
    while i + 1 < n:
        hit = <const unsigned char*>memchr(base + i, 60, n - i)  # the next "<"
        if hit is NULL:
            break
        i = hit - base
        end = i + 2 < n and data[i + 1] == 47  # "</"
        j = i + 2 if end else i + 1
        c = data[j] if j < n else 0
        if not ((65 <= c <= 90) or (97 <= c <= 122)):
            i = j
            continue
        k = j
        while k < n and _name_char(data[k]):
            k += 1
        packed = _pack(base + j, k - j) if k - j <= 8 else 0
        if packed and _among(packed, _FORMATTING, _N_FORMATTING):
            if end:
                formatting -= formatting > 0
            else:
                formatting += 1
                if formatting > max_formatting:
                    max_formatting = formatting
            i = k
            continue
        if not end:
            reopened += formatting
        if not (packed and _among(packed, _UNCOUNTED, _N_UNCOUNTED)):
            if end:
                depth -= depth > 0
            else:
                depth += 1
                if depth > max_depth:
                    max_depth = depth
                options += packed == _OPTION
        i = k
    return max_depth, max_formatting, options, reopened
