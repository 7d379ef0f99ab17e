# cython: language_level=3
"""walk.py's walk, tree.py's attribute-cap sweep and decode.py's UTF-8 test, compiled: the walk over libxml2's nodes themselves.

The Python walk spends most of its time in lxml's per-element proxies (iterwalk's events,
keys(), get(), text, tail): here the same steps read the C nodes lxml's tree is made of (names,
attributes and text nodes, UTF-8 in libxml2), and build the same ``Page``. walk.py is the
reference: the vocabularies, the paragraph scores and ``Page`` come from blocks.py, as walk.py's do, and
tests/test_html.py checks that both walks give equal pages on every shared page and on the
hostile trees. Built by setup.py where a C compiler is (optional: without it, walk.py's walk runs).
"""

cimport lxml.includes.etreepublic as cetree
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint64_t
from libc.string cimport memchr, memcpy, memset, strlen
from lxml.includes.tree cimport (
    XML_CDATA_SECTION_NODE,
    XML_ELEMENT_NODE,
    XML_TEXT_NODE,
    XML_XINCLUDE_END,
    XML_XINCLUDE_START,
    xmlAttr,
    xmlNode,
)

from lxml import etree

include "page_walk.pxi"

cetree.import_lxml__etree()

# The version of lxml this was compiled against: another one's element layout may differ, so
# walk.py uses this walk only when the running lxml is the same (see walk.py).
LXML_VERSION = etree.LXML_VERSION


cdef inline str _utf8(const char* s):
    return PyUnicode_DecodeUTF8(s, strlen(s), NULL)


cdef inline xmlNode* _text_or_skip(xmlNode* n):
    """lxml's _textNodeOrSkip: n if a text node, past XInclude markers, else NULL."""
    while n is not NULL:
        if n.type == XML_TEXT_NODE or n.type == XML_CDATA_SECTION_NODE:
            return n
        if n.type == XML_XINCLUDE_START or n.type == XML_XINCLUDE_END:
            n = n.next
            continue
        return NULL
    return NULL


cdef int _add_text(_Walk w, xmlNode* n) except -1:
    """lxml's _collectText from ``n`` (an element's .text from its first child, its .tail from
    its next sibling) into the walk's run: the consecutive text nodes."""
    n = _text_or_skip(n)
    while n is not NULL:
        if n.content is not NULL:
            w.add(<const char*>n.content, strlen(<const char*>n.content))
        n = _text_or_skip(n.next)
    return 0


cdef object _attr_value(void* attribute):
    """An attribute's value (lxml's get(): its text children joined)."""
    cdef xmlNode* c = (<xmlAttr*>attribute).children
    if c is NULL:
        return ""
    if c.next is NULL:
        return _utf8(<const char*>c.content) if c.content is not NULL else ""
    cdef bytes joined = b""
    while c is not NULL:
        if c.content is not NULL:
            joined += <bytes>(<const char*>c.content)
        c = c.next
    return joined.decode("utf-8")


cdef const char* _attr_bytes(void* attribute, Py_ssize_t* n):
    """An attribute's value in one piece (its one text child), else NULL."""
    cdef xmlNode* c = (<xmlAttr*>attribute).children
    if c is NULL:
        n[0] = 0
        return _EMPTY
    if c.next is not NULL or c.content is NULL:
        return NULL
    n[0] = strlen(<const char*>c.content)
    return <const char*>c.content


cdef inline xmlNode* _element(xmlNode* n):
    """``n`` or its first following sibling that is an element, or NULL (as iterwalk, which
    does not visit comments or PIs; the parser drops them anyway)."""
    while n is not NULL and n.type != XML_ELEMENT_NODE:
        n = n.next
    return n


cdef tuple _tag(_Walk w, xmlNode* n):
    """(the element's tag as lxml gives it, "{namespace}name" where it has one; its kind bits).
    libxml2 keeps one copy of each name per document: one lookup per name."""
    cdef size_t key = <size_t>n.name
    hit = w.names.get(key)
    if hit is None:
        name = _utf8(<const char*>n.name)
        hit = w.names[key] = (name, _kind(name))
    if n.ns is not NULL and n.ns.href is not NULL:
        name = "{" + _utf8(<const char*>n.ns.href) + "}" + (<tuple>hit)[0]
        return (name, _kind(name))
    return <tuple>hit


def walk(top, double deadline):
    """walk.walk over ``top``'s C nodes: the same Page."""
    cdef _Walk w = _Walk(deadline)
    cdef xmlNode* c_top = (<cetree._Element?>top)._c_node
    cdef xmlNode* n = c_top
    cdef xmlNode* child
    cdef xmlAttr* a
    cdef void* slots[N_ATTRIBUTES]
    cdef int kind, action
    while True:
        # ---- the start of element n
        w.tick()
        tag, kind = _tag(w, n)
        if kind & K_JUNK:  # skipped as if it were not there (no line break), its tail kept
            action = w.skip(<size_t>n)
        else:
            memset(slots, 0, sizeof(slots))
            a = n.properties
            while a is not NULL:
                if a.ns is NULL:
                    _keep_first(slots, <const char*>a.name, strlen(<const char*>a.name), a)
                a = a.next
            action = w.start_element(<size_t>n, tag, kind, slots, _attr_value, _attr_bytes)
            if action == ENTER:
                _add_text(w, n.children)
        if action != SKIP:
            child = _element(n.children)
            if child is not NULL:
                n = child
                continue
        # ---- the ends of n and of the ancestors it closes, each followed by its tail
        while True:
            w.tick()
            w.end(<size_t>n)
            if n is c_top:
                return w.finish()
            _add_text(w, n.next)
            child = _element(n.next)
            if child is not NULL:
                n = child
                break
            n = n.parent


# ---------------------------------------------------------------- the attribute cap's sweep

cdef inline bint _ws(unsigned char c):
    return c == 9 or c == 10 or c == 12 or c == 13 or c == 32


def over_cap(const unsigned char[:] data, Py_ssize_t max_attrs):
    """tree.py's _SWEEP (the reference) as a loop: whether a tag of ``data`` has ``max_attrs``
    attributes or more, tags and attributes read as the HTML5 tokenizer reads them, every step
    possessive as the pattern's."""
    cdef Py_ssize_t n = data.shape[0], i = 0, j, k, count
    cdef unsigned char c, q
    cdef const unsigned char* base = &data[0] if n else NULL
    cdef const unsigned char* hit
    while i < n:
        hit = <const unsigned char*>memchr(base + i, 60, n - i)  # the next "<"
        if hit is NULL:
            break
        i = hit - base
        if i + 1 >= n or not ((65 <= data[i + 1] <= 90) or (97 <= data[i + 1] <= 122)):
            i += 1
            continue
        j = i + 2  # the tag head: "<", a letter, [^WS/>]*
        while j < n and not _ws(data[j]) and data[j] != 47 and data[j] != 62:
            j += 1
        count = 0
        while True:  # attributes
            k = j
            while k < n and (_ws(data[k]) or data[k] == 47):
                k += 1
            if k >= n or data[k] == 62:
                break
            k += 1  # a name: [^WS/>] then [^WS/>=]*
            while k < n and not _ws(data[k]) and data[k] != 47 and data[k] != 62 and data[k] != 61:
                k += 1
            j = k  # an optional value: WS* "=" WS* then a quoted or bare value
            while k < n and _ws(data[k]):
                k += 1
            if k < n and data[k] == 61:
                k += 1
                while k < n and _ws(data[k]):
                    k += 1
                if k < n and (data[k] == 34 or data[k] == 39):
                    q = data[k]
                    hit = <const unsigned char*>memchr(base + k + 1, q, n - k - 1)  # most of a tag's bytes
                    k = n if hit is NULL else hit - base + 1
                    j = k
                elif k < n and not _ws(data[k]) and data[k] != 62:
                    while k < n and not _ws(data[k]) and data[k] != 62:
                        k += 1
                    j = k
            count += 1
            if count >= max_attrs:
                return True
        i = j
    return False


# ---------------------------------------------------------------- strict UTF-8

cdef inline bint _cont(const unsigned char* p, Py_ssize_t i, Py_ssize_t k, Py_ssize_t n):
    """p[i + 1 : i + 1 + k] are k continuation bytes."""
    cdef Py_ssize_t j
    if i + k >= n:
        return False
    for j in range(1, k + 1):
        if p[i + j] & 0xC0 != 0x80:
            return False
    return True


def is_utf8(const unsigned char[:] data):
    """Whether ``data`` decodes as strict UTF-8 (bytes.decode("utf-8") succeeds: no overlong
    form, surrogate or code point past U+10FFFF; Unicode's table 3-7), without making the str:
    eight ASCII bytes at a time."""
    cdef Py_ssize_t n = data.shape[0], i = 0
    cdef const unsigned char* p = &data[0] if n else NULL
    cdef unsigned char c, d
    cdef uint64_t word
    while i < n:
        while i + 8 <= n:
            memcpy(&word, p + i, 8)
            if word & 0x8080808080808080ULL:
                break
            i += 8
        if i >= n:
            break
        c = p[i]
        if c < 0x80:
            i += 1
            continue
        d = p[i + 1] if i + 1 < n else 0
        if 0xC2 <= c <= 0xDF:
            if not _cont(p, i, 1, n):
                return False
            i += 2
        elif 0xE0 <= c <= 0xEF:
            if (c == 0xE0 and d < 0xA0) or (c == 0xED and d > 0x9F) or not _cont(p, i, 2, n):
                return False  # overlong; a surrogate
            i += 3
        elif 0xF0 <= c <= 0xF4:
            if (c == 0xF0 and d < 0x90) or (c == 0xF4 and d > 0x8F) or not _cont(p, i, 3, n):
                return False  # overlong; past U+10FFFF
            i += 4
        else:
            return False
    return True
