# cython: language_level=3
"""walk.py's walk and tree.py's attribute-cap sweep, compiled: the walk over libxml2's nodes themselves.

The Python walk spends most of its time in lxml's per-element proxies (iterwalk's events,
keys(), get(), text, tail): here the same steps read the C nodes lxml's tree is made of (names,
attributes and text nodes, UTF-8 in libxml2), and build the same ``Page``. walk.py is the
reference: the vocabularies, the paragraph scores and ``Page`` come from blocks.py, as walk.py's do, and
tests/test_html.py checks that both walks give equal pages on every shared page and on the
hostile trees. Built by setup.py where a C compiler is (optional: without it, walk.py's walk runs).
"""

cimport lxml.includes.etreepublic as cetree
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport strcmp, strlen
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

from tokenmill.transforms.deadline import check

from .hints import F_BOILERPLATE, F_POSITIVE, F_UNLIKELY, UNLIKELY_ARTICLE_RE, hints

from . import blocks

cetree.import_lxml__etree()

# The version of lxml this was compiled against: another one's element layout may differ, so
# walk.py uses this walk only when the running lxml is the same (see walk.py).
LXML_VERSION = etree.LXML_VERSION

cdef object _INLINE = blocks.INLINE
cdef object _JUNK = blocks.JUNK
cdef object _HEADINGS = blocks.HEADINGS
cdef object _CHROME = blocks.CHROME_TAGS
cdef object _HIDDEN_CLASSES = blocks.HIDDEN_CLASSES
cdef object _UNLIKELY_ROLES = blocks.UNLIKELY_ROLES
cdef object _POSITIVE_ITEMPROP = blocks.POSITIVE_ITEMPROP
cdef object _is_hidden_style = blocks.is_hidden_style
cdef object _BR = blocks.BR
cdef object _prose_commas = blocks.prose_commas
cdef object _paragraph_points = blocks.paragraph_points
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


cdef int _kind(str tag):
    return ((K_INLINE if tag in _INLINE else 0) | (K_HEADING if tag in _HEADINGS else 0)
            | (K_CHROME if tag in _CHROME else 0) | (K_BR if tag == "br" else 0) | (K_A if tag == "a" else 0)
            | (K_PRE if tag == "pre" else 0) | (K_SEMANTIC if tag in ("article", "main") else 0)
            | (K_JUNK if tag in _JUNK else 0))


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


cdef object _text(xmlNode* n):
    """lxml's _collectText from ``n`` (an element's .text from its first child, its .tail from
    its next sibling): the consecutive text nodes joined; None where there is no text."""
    n = _text_or_skip(n)
    if n is NULL:
        return None
    cdef xmlNode* nxt = _text_or_skip(n.next)
    if nxt is NULL:
        if n.content is NULL or n.content[0] == 0:
            return None
        return _utf8(<const char*>n.content)
    cdef bytes joined = b""
    while n is not NULL:
        if n.content is not NULL:
            joined += <bytes>(<const char*>n.content)
        n = _text_or_skip(n.next)
    return joined.decode("utf-8") or None


cdef str _attr_value(xmlAttr* a):
    """An attribute's value (lxml's get(): its text children joined)."""
    cdef xmlNode* c = a.children
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


cdef inline xmlNode* _element(xmlNode* n):
    """``n`` or its first following sibling that is an element, or NULL (as iterwalk, which
    does not visit comments or PIs; the parser drops them anyway)."""
    while n is not NULL and n.type != XML_ELEMENT_NODE:
        n = n.next
    return n


cdef class _Walk:
    cdef object pg, buf, tags, parents, ends, weights, flags, classes
    cdef object b_text, b_node, b_len, b_link, b_commas, b_points
    cdef Py_ssize_t link_len, n_br, pre_depth, cur
    cdef dict names, hidden_classes

    def __cinit__(self):
        pg = self.pg = _Page()
        self.tags, self.parents, self.ends = pg.tag, pg.parent, pg.end
        self.weights, self.flags, self.classes = pg.weight, pg.flags, pg.cls
        self.b_text, self.b_node, self.b_len, self.b_link = pg.b_text, pg.b_node, pg.b_len, pg.b_link
        self.b_commas, self.b_points = pg.b_commas, pg.b_points
        self.buf = []
        self.link_len = self.n_br = self.pre_depth = 0
        self.cur = -1
        self.names = {}
        self.hidden_classes = {}  # class attribute -> whether it hides the element

    cdef bint hides(self, str cls):
        hit = self.hidden_classes.get(cls)
        if hit is None:
            hit = self.hidden_classes[cls] = not _HIDDEN_CLASSES.isdisjoint(cls.split())
        return hit

    cdef tuple tag(self, xmlNode* n):
        """(the element's tag as lxml gives it, "{namespace}name" where it has one; its kind
        bits). libxml2 keeps one copy of each name per document: one lookup per name."""
        cdef size_t key = <size_t>n.name
        hit = self.names.get(key)
        if hit is None:
            name = _utf8(<const char*>n.name)
            hit = self.names[key] = (name, _kind(name))
        if n.ns is not NULL and n.ns.href is not NULL:
            name = "{" + _utf8(<const char*>n.ns.href) + "}" + (<tuple>hit)[0]
            return (name, _kind(name))
        return <tuple>hit

    cdef inline void add(self, object t, bint in_link):
        if self.pre_depth:
            t = t.replace("\n", _BR)
        self.buf.append(t)
        if in_link:
            self.link_len += len(t)

    cdef void flush(self):
        text = "".join(self.buf)
        del self.buf[:]
        cdef Py_ssize_t raw_len = len(text) - self.n_br
        cdef Py_ssize_t ln = self.link_len
        self.link_len = self.n_br = 0
        if _BR in text:
            text = "\n".join(filter(None, (" ".join(part.split()) for part in text.split(_BR))))
        elif text.isspace():
            return
        else:
            text = " ".join(text.split())
        if not text:
            return
        cdef Py_ssize_t n = len(text)
        self.b_text.append(text)
        self.b_node.append(self.cur)
        self.b_len.append(n)
        self.b_link.append(n * ln / raw_len if ln else 0.0)
        commas = _prose_commas(text)
        self.b_commas.append(commas)
        if "\n" in text:
            self.b_points.append(sum([_paragraph_points(line) for line in text.split("\n")]))
        else:
            self.b_points.append(2 + commas + min(n // 100, _LENGTH_CAP) if n >= 25 else 0)


def walk(top, double deadline):
    """walk.walk over ``top``'s C nodes: the same Page."""
    cdef _Walk w = _Walk()
    cdef xmlNode* c_top = (<cetree._Element?>top)._c_node
    cdef xmlNode* n = c_top
    cdef xmlNode* skipping = NULL
    cdef xmlNode* block_el = NULL
    cdef xmlNode* child
    cdef xmlAttr* a
    cdef xmlAttr* a_class
    cdef xmlAttr* a_id
    cdef xmlAttr* a_hidden
    cdef xmlAttr* a_aria
    cdef xmlAttr* a_style
    cdef xmlAttr* a_role
    cdef xmlAttr* a_itemprop
    cdef list stack = []  # the open block nodes
    cdef list open_blocks = []  # their C nodes (as integers)
    cdef list open_links = []  # the open <a> C nodes
    cdef Py_ssize_t count = 0, i
    cdef int unlikely, weight, flag, kind
    cdef bint descend
    cdef const char* name
    while True:
        # ---- the start of element n
        count += 1
        if not count & 255:
            check(deadline)
        tag, kind = w.tag(n)
        if kind & K_JUNK:  # skipped as if it were not there (no line break), its tail kept
            skipping = n
            descend = False
        else:
            descend = True
            unlikely = weight = flag = 0
            cls = ""
            a_class = a_id = a_hidden = a_aria = a_style = a_role = a_itemprop = NULL
            a = n.properties
            while a is not NULL:
                if a.ns is NULL:
                    name = <const char*>a.name
                    if strcmp(name, "class") == 0:
                        if a_class is NULL:
                            a_class = a
                    elif strcmp(name, "id") == 0:
                        if a_id is NULL:
                            a_id = a
                    elif strcmp(name, "hidden") == 0:
                        a_hidden = a
                    elif strcmp(name, "aria-hidden") == 0:
                        if a_aria is NULL:
                            a_aria = a
                    elif strcmp(name, "style") == 0:
                        if a_style is NULL:
                            a_style = a
                    elif strcmp(name, "role") == 0:
                        if a_role is NULL:
                            a_role = a
                    elif strcmp(name, "itemprop") == 0:
                        if a_itemprop is NULL:
                            a_itemprop = a
                a = a.next
            if a_class is not NULL:
                cls = _attr_value(a_class)
            id_ = _attr_value(a_id) if a_id is not NULL and not kind & K_HEADING else ""
            if (a_hidden is not NULL
                    or (a_aria is not NULL and _attr_value(a_aria) == "true")
                    or (a_style is not NULL and _is_hidden_style(_attr_value(a_style)))
                    or (cls and w.hides(cls))):
                if w.buf and not kind & K_INLINE:
                    w.flush()
                skipping = n
                descend = False
            else:
                if (cls or id_) and not kind & K_A:  # links are never skipped for their names
                    unlikely, weight = hints(cls, id_)
                if a_role is not NULL and _attr_value(a_role) in _UNLIKELY_ROLES:
                    unlikely |= F_UNLIKELY
                if a_itemprop is not NULL and _POSITIVE_ITEMPROP.search(_attr_value(a_itemprop)):
                    flag |= F_POSITIVE
                    weight += 25
                    unlikely = 0
                if kind & K_CHROME:
                    unlikely |= F_UNLIKELY
                if unlikely and (not stack or (kind & K_SEMANTIC and not UNLIKELY_ARTICLE_RE.search(cls))):
                    unlikely = 0  # the page itself and semantic content containers are never unlikely
                if kind & K_INLINE:
                    if kind & K_BR:
                        w.buf.append(_BR)
                        w.n_br += 1
                    elif unlikely & F_BOILERPLATE:  # e.g. <span class="share-count">
                        skipping = n
                        descend = False
                    else:
                        if kind & K_A:
                            open_links.append(<size_t>n)
                        t = _text(n.children)
                        if t:
                            w.add(t, len(open_links) > 0)
                else:
                    if w.buf:
                        w.flush()
                    i = len(w.tags)
                    w.tags.append(tag)
                    w.parents.append(w.cur)
                    w.ends.append(i)
                    w.weights.append(weight)
                    w.flags.append(flag | unlikely)
                    w.classes.append(cls)
                    stack.append(i)
                    open_blocks.append(<size_t>n)
                    block_el = n
                    w.cur = i
                    if kind & K_PRE:
                        w.pre_depth += 1
                    t = _text(n.children)
                    if t:
                        w.add(t, len(open_links) > 0)
        if descend:
            child = _element(n.children)
            if child is not NULL:
                n = child
                continue
        # ---- the ends of n and of the ancestors it closes, each followed by its tail
        while True:
            count += 1
            if not count & 255:
                check(deadline)
            if n is skipping:
                skipping = NULL
            elif n is block_el:
                if w.buf:
                    w.flush()
                w.ends[w.cur] = len(w.tags) - 1
                stack.pop()
                open_blocks.pop()
                if w.tags[w.cur] == "pre":
                    w.pre_depth -= 1
                if stack:
                    w.cur = stack[-1]
                    block_el = <xmlNode*><size_t>open_blocks[-1]
                else:
                    w.cur = -1
                    block_el = NULL
            elif open_links and <size_t>n == <size_t>open_links[-1]:
                open_links.pop()
            if n is c_top:
                if w.buf and w.cur >= 0:
                    w.flush()
                return w.pg
            t = _text(n.next)
            if t:
                w.add(t, len(open_links) > 0)
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
    while i < n:
        if data[i] != 60 or i + 1 >= n or not ((65 <= data[i + 1] <= 90) or (97 <= data[i + 1] <= 122)):
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
                    k += 1
                    while k < n and data[k] != q:
                        k += 1
                    if k < n:
                        k += 1
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
