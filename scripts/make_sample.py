#!/usr/bin/env python3
"""Rebuild the generated files of tokenmill's bundled sample corpus (tokenmill/sample/).

All text in the sample corpus was written for this project and is released with it
under the project's licence (Apache-2.0).

Most of the sample is plain UTF-8 files kept as they are (pages/*.html, notes.txt,
README.md).  This script writes the files that are binary, deliberately mis-encoded
or generated from data, so that they can be rebuilt byte for byte:

  pages/de_schwarzwald_wanderung.html   windows-1252 bytes, <meta charset="windows-1252">
  pages/ja_donabe_gohan.html            Shift_JIS bytes, no charset declared anywhere
  pages/it_matera_sassi.html.gz         gzip-compressed UTF-8 page (gzip mtime 0)
  pages/en_lisbon_cafes_mojibake.html   UTF-8 page whose text is mojibake
                                        (UTF-8 bytes decoded as cp1252, re-encoded)
  crawl.warc.gz                         WARC/1.0, one gzip member per record, fixed
                                        WARC-Date and WARC-Record-ID values
  docs.jsonl                            JSON lines, including two deliberately bad lines

Run:  python scripts/make_sample.py [--out DIR]     (default: tokenmill/sample)
Running it twice gives identical bytes.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import struct
import uuid
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tokenmill" / "sample"

# A fixed namespace so that record ids are stable: uuid5(NS, name).
NS = uuid.UUID("7d2c4c1e-5b0a-4f47-9a53-1c0ffee5a11e")


def record_id(name: str) -> str:
    return f"<urn:uuid:{uuid.uuid5(NS, name)}>"


def sloppy_cp1252_decode(data: bytes) -> str:
    """Decode bytes as windows-1252, mapping its 5 undefined bytes to the Latin-1 code point
    (what browsers and many old tools do). Used to manufacture realistic mojibake."""
    out = []
    for b in data:
        try:
            out.append(bytes([b]).decode("cp1252"))
        except UnicodeDecodeError:
            out.append(chr(b))
    return "".join(out)


def make_mojibake(text: str) -> str:
    """'café' -> 'cafÃ©', '’' -> 'â€™': the classic UTF-8-read-as-cp1252 accident."""
    return sloppy_cp1252_decode(text.encode("utf-8"))


# ---------------------------------------------------------------------------------------
# Encoded pages
# ---------------------------------------------------------------------------------------

DE_PAGE = """<!DOCTYPE html>
<html lang="de">
<head>
<meta charset="windows-1252">
<title>Westweg-Etappe: Von Hausach auf den Brandenkopf | Unterwegs im Süden</title>
<meta name="description" content="Eine anspruchsvolle, aber lohnende Tageswanderung im mittleren Schwarzwald – mit Einkehrtipps.">
<style>
  #kopf { background:#2d6a4f; color:#fff; } #kopf a { color:#d8f3dc; margin-right:10px; }
  .cookie-hinweis { background:#fefae0; border:1px solid #bc6c25; padding:8px; }
  .beitrag p { hyphens:auto; }
</style>
<script>var _etracker = { pageName: "westweg-hausach" };</script>
</head>
<body>
<div id="kopf">
  <a href="/" class="logo">Unterwegs im Süden</a>
  <a href="/">Startseite</a>
  <a href="/wandern/">Wandern</a>
  <a href="/radfahren/">Radfahren</a>
  <a href="/staedtereisen/">Städtereisen</a>
  <a href="/ausruestung/">Ausrüstung</a>
  <a href="/ueber-uns/">Über uns</a>
</div>
<div class="cookie-hinweis" id="cookie-hinweis">
  Diese Website verwendet Cookies. Mit der weiteren Nutzung stimmen Sie der Verwendung zu.
  <a href="/datenschutz/">Datenschutzerklärung</a> <button>Alle akzeptieren</button> <button>Nur notwendige</button>
</div>

<div class="inhalt">
<div class="beitrag">
  <h1>Westweg-Etappe: Von Hausach auf den Brandenkopf</h1>
  <p class="meta">Von Jonas Keller – 21. Juni 2023 – Kategorie: Wandern</p>

  <p>Wer den Westweg von Pforzheim nach Basel in Etappen läuft, hört früher oder später von der „Königsetappe“ ab Hausach. Gleich hinter dem Bahnhof geht es steil bergauf, und auf den ersten zwei Kilometern gewinnt man mehr Höhe als auf mancher ganzen Tagestour. Belohnt wird man dafür mit einigen der schönsten Ausblicke im mittleren Schwarzwald und mit einem Gipfel, auf dem ein hölzerner Aussichtsturm über die Baumwipfel ragt.</p>

  <h2>Der Aufstieg</h2>
  <p>Vom Bahnhof Hausach folgt man der roten Raute durch die Altstadt und an der Burgruine vorbei in den Wald. Der Pfad ist schmal, wurzelig und nach Regen rutschig; gute Schuhe mit griffiger Sohle sind hier wichtiger als jede Funktionsjacke. Nach etwa einer Stunde öffnet sich der Wald zum ersten Mal, und man blickt hinunter ins Kinzigtal, wo die Züge nur noch so groß wie Spielzeug wirken.</p>
  <p>Danach wird es gemütlicher. Der Weg führt über breite Forststraßen und Wiesen, vorbei an alten Schwarzwaldhöfen mit tief heruntergezogenen Walmdächern. Im Frühsommer blühen hier Arnika und Knabenkraut, und mit etwas Glück sieht man Rehe am Waldrand.</p>

  <h2>Gut zu wissen</h2>
  <ul>
    <li>Länge: rund 21 Kilometer, etwa 1.000 Höhenmeter im Aufstieg</li>
    <li>Gehzeit: sechs bis sieben Stunden ohne längere Pausen</li>
    <li>Einkehr: Gasthaus am Brandenkopf, Vesperteller ab 12,50 €</li>
    <li>Rückfahrt: Bus ab Oberharmersbach, mit der KONUS-Gästekarte kostenlos</li>
  </ul>

  <p>Der Brandenkopf selbst ist mit 945 Metern kein besonders hoher Berg, aber weil er frei steht, reicht die Sicht bei klarem Wetter bis zu den Vogesen und manchmal sogar zu den Alpen. Wer oben übernachten möchte, sollte das Zimmer im Gasthaus rechtzeitig reservieren – an schönen Wochenenden ist es oft ausgebucht. Für alle anderen heißt es: Wasserflasche auffüllen, ein Stück Schwarzwälder Kirschtorte genießen und dann gemächlich ins Tal absteigen.</p>
</div>

<div class="seitenleiste">
  <h3>Das könnte Sie auch interessieren</h3>
  <ul>
    <li><a href="/wandern/feldberg-rundweg">Feldberg-Rundweg: Der Klassiker im Hochschwarzwald</a></li>
    <li><a href="/ausruestung/wanderschuhe-test">Wanderschuhe im Test: Was taugen leichte Modelle?</a></li>
    <li><a href="/wandern/schluchtensteig">Schluchtensteig: Wilde Wutach in vier Tagen</a></li>
  </ul>
</div>
</div>

<div class="kommentare">
  <h3>Kommentare (2)</h3>
  <p><strong>Gerda</strong> schrieb: Sind wir letzten Herbst gelaufen – der Anstieg hat es wirklich in sich!</p>
  <p><strong>Timo S.</strong> schrieb: Danke für den Tipp mit dem Bus, das hat uns einiges an Planung erspart.</p>
</div>

<div id="fuss">
  <p>© 2023 Unterwegs im Süden – Alle Rechte vorbehalten</p>
  <p><a href="/impressum/">Impressum</a> | <a href="/datenschutz/">Datenschutz</a> | <a href="/kontakt/">Kontakt</a></p>
</div>
<script>document.querySelectorAll('#cookie-hinweis button').forEach(function(b){b.onclick=function(){document.getElementById('cookie-hinweis').remove();};});</script>
</body>
</html>
"""

# Shift_JIS, and on purpose no <meta charset>: the reader has to detect the encoding.
JA_PAGE = """<!DOCTYPE html>
<html lang="ja">
<head>
<title>土鍋でおいしいご飯を炊く方法 | 台所ノート</title>
<meta name="description" content="土鍋を使ってふっくらとしたご飯を炊くための手順とコツを紹介します。">
<style>
  .header { background:#b5838d; } .header a { color:#fff; margin:0 8px; }
  .cookie { background:#ffcdb2; padding:8px; }
  .honbun p { line-height:2; }
</style>
<script>var pageInfo = { category: "cooking", id: 20240210 };</script>
</head>
<body>
<div class="header">
  <a href="/" class="logo">台所ノート</a>
  <a href="/">ホーム</a>
  <a href="/recipe/">レシピ</a>
  <a href="/dougu/">道具</a>
  <a href="/kisetsu/">季節の料理</a>
  <a href="/profile/">プロフィール</a>
  <a href="/otoiawase/">お問い合わせ</a>
</div>
<div class="cookie" id="cookie">
  当サイトではサービス向上のためにクッキーを使用しています。サイトを引き続きご利用いただくことで、クッキーの使用に同意したものとみなされます。
  <button>同意する</button> <a href="/privacy/">詳しく見る</a>
</div>

<div class="main">
<div class="honbun">
  <h1>土鍋でおいしいご飯を炊く方法</h1>
  <p class="date">2024年2月10日　文：佐藤美咲</p>

  <p>炊飯器がこれだけ便利になった今でも、土鍋で炊いたご飯には特別なおいしさがあります。土鍋は熱をゆっくりと均一に伝えるので、お米の一粒一粒にしっかりと火が通り、ふっくらとした食感に仕上がります。さらに、鍋底にできるおこげの香ばしさは、土鍋ならではの楽しみです。難しそうに見えますが、基本の手順さえ覚えれば、毎日の料理にも気軽に取り入れられます。</p>

  <h2>材料（二合分）</h2>
  <ul>
    <li>お米　二合</li>
    <li>水　四百ミリリットル</li>
    <li>土鍋（直径二十センチ前後のもの）</li>
  </ul>

  <h2>作り方</h2>
  <p>まず、お米をボウルに入れて、たっぷりの水でやさしく洗います。最初の水はすぐに捨てるのがポイントです。お米は最初に触れた水を一番よく吸うため、ぬかの匂いが移らないようにするためです。水が少し透き通るまで三回ほど洗ったら、ざるに上げて水気を切ります。</p>
  <p>次に、洗ったお米と分量の水を土鍋に入れて、三十分ほど浸水させます。冬場は水温が低いので、一時間ほど置くとよいでしょう。浸水が終わったら、ふたをして中火にかけます。十分ほどで沸騰し、ふたの穴から勢いよく湯気が出てきたら、弱火にして十五分炊きます。</p>
  <p>最後に火を止めて、ふたを開けずに十分ほど蒸らします。ここでふたを開けてしまうと、せっかくの蒸気が逃げてしまうので、我慢が大切です。蒸らし終わったら、しゃもじで底から大きく混ぜて、余分な水分を飛ばしましょう。</p>

  <h2>上手に炊くためのコツ</h2>
  <p>おこげを作りたい場合は、火を止める直前に強火にして、十秒から二十秒ほど加熱します。パチパチという音が聞こえたら合図です。また、新しい土鍋は使う前に「目止め」をしておくと、ひび割れを防ぐことができます。おかゆを炊いて鍋の細かいすき間をでんぷんでふさぐ方法が一般的です。土鍋は急な温度変化に弱いので、熱いうちに冷たい水につけないよう注意してください。</p>
</div>

<div class="side">
  <h3>関連記事</h3>
  <ul>
    <li><a href="/recipe/takikomi">秋の炊き込みご飯三種</a></li>
    <li><a href="/dougu/donabe-erabikata">はじめての土鍋の選び方</a></li>
    <li><a href="/recipe/misoshiru">だしから作るみそ汁</a></li>
  </ul>
</div>
</div>

<div class="comment">
  <h3>コメント（２）</h3>
  <p>ゆうこ：おこげのコツ、さっそく試してみます！</p>
  <p>たろう：目止めを知らずにひびを入れてしまいました…</p>
</div>

<div class="footer">
  <p>Copyright (C) 2024 台所ノート All Rights Reserved.</p>
  <p><a href="/kiyaku/">利用規約</a> | <a href="/privacy/">プライバシーポリシー</a> | <a href="/sitemap/">サイトマップ</a></p>
</div>
<script>document.querySelector('#cookie button').onclick=function(){document.getElementById('cookie').style.display='none';};</script>
</body>
</html>
"""

IT_PAGE = """<!DOCTYPE html>
<html lang="it">
<head>
<meta charset="utf-8">
<title>Matera in due giorni: cosa vedere tra i Sassi | Zaino e Taccuino</title>
<meta name="description" content="Itinerario di due giorni a Matera: il Sasso Caveoso, il Sasso Barisano, le chiese rupestri e dove mangiare.">
<style>
  .testata { background:#e76f51; } .testata a { color:#fff; padding:0 9px; }
  .avviso-cookie { background:#264653; color:#fff; padding:10px; }
  .articolo p { line-height:1.7; }
</style>
<script>window.iubenda = { siteId: 0, cookiePolicyId: 0, lang: "it" };</script>
</head>
<body>
<div class="testata">
  <a href="/" class="logo">Zaino e Taccuino</a>
  <a href="/">Home</a>
  <a href="/italia/">Italia</a>
  <a href="/europa/">Europa</a>
  <a href="/consigli/">Consigli di viaggio</a>
  <a href="/chi-sono/">Chi sono</a>
</div>
<div class="avviso-cookie" id="avviso-cookie">
  Questo sito utilizza cookie tecnici e, previo tuo consenso, cookie di profilazione di terze parti. Chiudendo questo banner acconsenti all’uso dei cookie.
  <button>Accetta</button> <button>Rifiuta</button> <a href="/cookie-policy/">Cookie policy</a>
</div>

<div class="contenitore">
<article class="articolo">
  <h1>Matera in due giorni: cosa vedere tra i Sassi</h1>
  <p class="data">Scritto da Giulia Ferraro il 4 ottobre 2023</p>

  <p>La prima volta che si arriva al belvedere di Piazza Vittorio Veneto e si guarda giù verso i Sassi, è difficile credere che fino agli anni Cinquanta queste case scavate nella roccia fossero considerate una vergogna nazionale. Migliaia di famiglie vivevano nelle grotte insieme agli animali, senza acqua corrente né luce elettrica, finché una legge speciale non le trasferì nei nuovi quartieri costruiti sull’altopiano. Oggi Matera è patrimonio dell’Unesco, e quegli stessi vicoli ospitano alberghi, laboratori di artigiani e ristoranti.</p>

  <h2>Primo giorno: il Sasso Caveoso</h2>
  <p>Conviene cominciare la mattina presto, quando la luce è morbida e le scale di pietra non sono ancora affollate. Dal centro si scende verso la chiesa di San Pietro Caveoso e da lì si sale fino a Santa Maria de Idris, una chiesa rupestre costruita sulla cima di uno sperone di roccia. All’interno si conservano affreschi molto antichi, scoloriti ma ancora leggibili. Vale la pena visitare anche una delle case-grotta arredate come un tempo, per capire davvero come si viveva: il letto sopra il fieno, la mula in un angolo, il pozzo per raccogliere l’acqua piovana.</p>

  <h2>Secondo giorno: il Sasso Barisano e la Murgia</h2>
  <p>Il Sasso Barisano è la parte più vivace della città, con botteghe, caffè e terrazze affacciate sulla gravina. Nel pomeriggio si può attraversare il ponte tibetano sul torrente e salire sul lato opposto, nel parco della Murgia Materana. Da lassù si gode la vista più bella sui Sassi, soprattutto al tramonto, quando le luci delle case si accendono una dopo l’altra.</p>
  <ul>
    <li>Scarpe comode: si cammina quasi sempre su scale e pietra liscia.</li>
    <li>Acqua e cappello d’estate, perché il sole sulle rocce è implacabile.</li>
    <li>Da assaggiare: il pane di Matera, la crapiata e i peperoni cruschi.</li>
  </ul>
  <p>Due giorni bastano per un primo assaggio, ma molti viaggiatori finiscono per restare più a lungo. Matera ha un ritmo tutto suo, e dopo qualche ora passata a perdersi tra i vicoli si capisce perché.</p>
</article>

<aside class="barra-laterale">
  <h3>Articoli correlati</h3>
  <ul>
    <li><a href="/italia/alberobello-trulli">Alberobello e i trulli: guida pratica</a></li>
    <li><a href="/italia/costa-di-maratea">Maratea, la perla del Tirreno lucano</a></li>
    <li><a href="/consigli/viaggiare-in-treno-al-sud">Viaggiare in treno nel Sud Italia</a></li>
  </ul>
</aside>
</div>

<div class="commenti">
  <h3>Commenti (2)</h3>
  <p><b>Francesca</b>: Ci sono stata a maggio, il tramonto dalla Murgia è indimenticabile.</p>
  <p><b>Luca</b>: Consiglio anche la visita guidata alle cisterne sotto la piazza!</p>
</div>

<footer>
  <p>© 2023 Zaino e Taccuino – P.IVA 00000000000</p>
  <p><a href="/privacy/">Privacy</a> · <a href="/cookie-policy/">Cookie policy</a> · <a href="/contatti/">Contatti</a></p>
</footer>
<script>document.querySelectorAll('#avviso-cookie button').forEach(function(b){b.onclick=function(){document.getElementById('avviso-cookie').remove();};});</script>
</body>
</html>
"""

# Written correctly here; make_mojibake() garbles it on the way out (the meta still says
# utf-8, and the bytes *are* valid UTF-8 -- they just spell "cafÃ©" instead of "café").
EN_MOJIBAKE_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Three Lisbon cafés worth the climb – Slow Mornings Travel</title>
<meta name="description" content="Where to drink a bica and eat a pastel de nata in Lisbon’s hilliest neighbourhoods.">
<style>
  .site-head { background:#e9c46a; } .site-head a { margin:0 10px; }
  .consent { background:#1b263b; color:#fff; padding:10px; }
</style>
<script>var pageviews = (window.pageviews || 0) + 1;</script>
</head>
<body>
<div class="site-head">
  <a href="/" class="logo">Slow Mornings Travel</a>
  <a href="/destinations/">Destinations</a>
  <a href="/food/">Food &amp; Drink</a>
  <a href="/itineraries/">Itineraries</a>
  <a href="/about/">About</a>
  <a href="/shop/">Shop</a>
</div>
<div class="consent" id="consent">
  We use cookies to personalise content and ads and to analyse our traffic. <a href="/cookies/">Cookie policy</a>
  <button>Accept</button> <button>Decline</button>
</div>

<div class="wrap">
<div class="entry-content">
  <h1>Three Lisbon cafés worth the climb</h1>
  <p class="entry-meta">Posted on 2 May 2023 by Nina Okafor · Portugal, Food &amp; Drink</p>

  <p>Lisbon is a city of seven hills, and every café guide seems to assume you’ll happily walk up all of them before breakfast. After a week of sore calves and “just one more” pastel de nata, I can say it’s worth it – but only if you know where you’re going. Here are three places that rewarded the effort, from a tiny counter in Graça to a tiled terrace with the best view of the river.</p>

  <h2>1. A counter café in Graça</h2>
  <p>The first is barely bigger than a wardrobe: six stools, a chalkboard menu and an espresso machine older than the owner’s grandson, who now runs the place. Order a bica, the Lisbon name for a short, strong coffee, and a toasted slice of pão de Deus with butter. Locals stand at the counter, drink in two sips and leave; nobody will rush you, but nobody lingers either. It’s the most honest €2.10 breakfast I’ve had anywhere.</p>

  <h2>2. The tiled terrace near the miradouro</h2>
  <p>Further down the hill, a café with blue-and-white azulejos on every wall serves its coffee on a terrace overlooking the Tagus. It’s busier and pricier, and the service is famously “relaxed”, but at eight in the morning, before the tour groups arrive, it’s pure calm. Try the galão, a tall glass of milky coffee, and watch the yellow tram rattle past below.</p>

  <h2>3. The bakery that sells out by ten</h2>
  <p>Finally, the bakery. There’s no sign, only a queue. The custard tarts come out of the oven in trays of forty, their tops blistered almost black, and the woman at the till dusts each one with cinnamon without asking. Don’t try to be naïve and arrive at eleven: by then the shelves are empty and the shutters are half down.</p>
  <p>A word of advice: wear proper shoes. The limestone pavements – the famous calçada – are beautiful, and after a light shower they’re as slippery as ice.</p>
</div>

<div class="widget-area">
  <h3>Related posts</h3>
  <ul>
    <li><a href="/food/porto-francesinha">The francesinha: Porto’s most dramatic sandwich</a></li>
    <li><a href="/itineraries/sintra-day-trip">A day trip to Sintra without the crowds</a></li>
    <li><a href="/destinations/algarve-off-season">The Algarve in November</a></li>
  </ul>
</div>
</div>

<div class="comments-area">
  <h3>2 thoughts on “Three Lisbon cafés worth the climb”</h3>
  <p><b>Chloé</b>: The bakery queue is real. Worth every minute.</p>
  <p><b>Rui</b>: As a lisboeta – great picks, but don’t tell everyone!</p>
</div>

<footer class="site-footer">
  <p>© 2023 Slow Mornings Travel · Powered by coffee</p>
  <p><a href="/privacy/">Privacy</a> · <a href="/disclosure/">Affiliate disclosure</a> · <a href="/contact/">Contact</a></p>
</footer>
<script>document.querySelectorAll('#consent button').forEach(function(b){b.onclick=function(){document.getElementById('consent').remove();};});</script>
</body>
</html>
"""


def write_pages(out: Path) -> None:
    pages = out / "pages"
    pages.mkdir(parents=True, exist_ok=True)
    (pages / "de_schwarzwald_wanderung.html").write_bytes(DE_PAGE.encode("cp1252"))
    (pages / "ja_donabe_gohan.html").write_bytes(JA_PAGE.encode("shift_jis"))
    (pages / "it_matera_sassi.html.gz").write_bytes(gzip.compress(IT_PAGE.encode("utf-8"), 9, mtime=0))
    (pages / "en_lisbon_cafes_mojibake.html").write_bytes(make_mojibake(EN_MOJIBAKE_PAGE).encode("utf-8"))


# ---------------------------------------------------------------------------------------
# crawl.warc.gz
# ---------------------------------------------------------------------------------------

FERRY_ARTICLE = """
  <h1>Harbour ferry returns after winter repairs, with a new timetable</h1>
  {dateline}
  <p>The little blue ferry that links the town quay with Gull Point is back in service after four months in dry dock, and regular passengers say the wait was worth it. The boat, which first crossed the harbour in 1972, has a new engine, a rebuilt wheelhouse and, for the first time, a ramp wide enough for wheelchairs and cargo bikes.</p>
  <p>Skipper Dan Whitlock, who has worked on the crossing for eighteen years, said the old engine had been "held together by hope and spare parts" by the end of last summer. The new one burns about a third less fuel and is noticeably quieter, which he hopes will please residents of the waterfront flats who complained about early morning noise.</p>
  <h2>More crossings in the evening</h2>
  <p>The harbour trust has used the relaunch to change the timetable. Crossings now run every twenty minutes between seven in the morning and seven in the evening, and every forty minutes until eleven on Fridays and Saturdays, so that people who work late in town no longer face the long walk round by the bridge. Single fares stay at the same price, but a new monthly pass is aimed at commuters and students.</p>
  <p>On the first morning about sixty people made the three-minute trip before nine o'clock. Among them was Margaret Osei, who has crossed the harbour to her allotment almost every day for thirty years. "When it stopped in November I had to take two buses," she said. "Having it back feels like getting a piece of the town back."</p>
  <p>The trust says it will review the evening service in the autumn, once it has a full summer of passenger numbers.</p>
"""

FERRY_PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>Harbour ferry returns after winter repairs | The Harbour Times</title>
<style>nav a{{margin-right:12px}} .cookies{{background:#eee}}</style>
<script>var section = "news";</script></head>
<body>
<header><a href="/" class="brand">The Harbour Times</a>
<nav>{nav}</nav></header>
<div class="cookies" id="cookies">We use cookies to improve your experience. <button>OK</button></div>
<main><article>{article}</article>
<aside><h3>Latest news</h3><ul>
<li><a href="/news/2024/03/lifeboat-open-day">Lifeboat station open day draws record crowd</a></li>
<li><a href="/news/2024/03/fish-market-prices">Fish market prices rise after stormy week</a></li>
</ul></aside></main>
<footer>&copy; 2024 The Harbour Times &middot; <a href="/privacy">Privacy</a> &middot; <a href="/contact">Contact</a></footer>
</body></html>
"""

FERRY_NAV_MAIN = (
    '<a href="/">Home</a> <a href="/news">News</a> <a href="/sport">Sport</a> '
    '<a href="/whats-on">What\'s on</a> <a href="/tides">Tide tables</a> <a href="/subscribe">Subscribe</a>'
)
FERRY_NAV_AMP = (
    '<a href="/">Home</a> <a href="/news">News</a> <a href="/puzzles">Puzzles</a> '
    '<a href="/obituaries">Obituaries</a> <a href="/app">Get the app</a>'
)

FERRY_HTML = FERRY_PAGE.format(
    nav=FERRY_NAV_MAIN,
    article=FERRY_ARTICLE.format(
        dateline='<p class="dateline">By Alice Penrose &middot; Published 12 March 2024</p>'
    ),
)
# Near-duplicate: the same article served under the "amp" path with another menu and dateline.
FERRY_AMP_HTML = FERRY_PAGE.format(
    nav=FERRY_NAV_AMP,
    article=FERRY_ARTICLE.format(
        dateline='<p class="dateline">Alice Penrose &middot; Updated 13 March 2024, 08:15 &middot; 3 min read</p>'
    ),
)

APFELKUCHEN_HTML = """<!DOCTYPE html>
<html lang="de"><head><meta charset="utf-8"><title>Omas versunkener Apfelkuchen – Kuchenliebe</title>
<script>var rezeptId = 4711;</script></head>
<body>
<div class="nav"><a href="/">Start</a> | <a href="/rezepte/">Rezepte</a> | <a href="/backschule/">Backschule</a> | <a href="/newsletter/">Newsletter</a></div>
<div class="cookiebox">Wir verwenden Cookies, um Ihnen das beste Nutzererlebnis zu bieten. <button>Einverstanden</button></div>
<div class="rezept">
<h1>Omas versunkener Apfelkuchen</h1>
<p>Es gibt Kuchen, die man für besondere Anlässe backt, und es gibt Kuchen, die einfach immer gehen. Der versunkene Apfelkuchen gehört eindeutig zur zweiten Sorte. Er braucht keine komplizierten Zutaten, keine Sahne und keine lange Kühlzeit, und trotzdem ist er am Sonntagnachmittag meistens als Erstes aufgegessen.</p>
<h2>Zutaten für eine Springform (26 cm)</h2>
<ul><li>125 g weiche Butter</li><li>125 g Zucker und ein Päckchen Vanillezucker</li><li>3 Eier</li><li>200 g Mehl und 2 Teelöffel Backpulver</li><li>3 bis 4 säuerliche Äpfel, zum Beispiel Boskop</li></ul>
<h2>So geht's</h2>
<p>Die Butter mit Zucker und Vanillezucker schaumig rühren, dann die Eier einzeln unterrühren. Mehl und Backpulver mischen und kurz unter die Masse heben, bis ein glatter Teig entsteht. Den Teig in die gefettete Form streichen. Die Äpfel schälen, vierteln und das Kerngehäuse entfernen. Die Viertel auf der runden Seite mehrmals längs einschneiden und dicht nebeneinander auf den Teig setzen.</p>
<p>Im vorgeheizten Ofen bei 180 Grad Ober- und Unterhitze etwa 45 Minuten backen. Beim Backen geht der Teig um die Äpfel herum auf, sodass sie scheinbar im Kuchen versinken – daher der Name. Nach dem Abkühlen mit Puderzucker bestäuben. Wer mag, bestreicht den noch warmen Kuchen mit etwas erwärmter Aprikosenmarmelade, dann glänzen die Äpfel besonders schön.</p>
</div>
<div class="kommentare"><b>Heike</b>: Backe ich seit Jahren genau so!</div>
<footer>© 2024 Kuchenliebe · <a href="/impressum">Impressum</a> · <a href="/datenschutz">Datenschutz</a></footer>
</body></html>
"""

# Served as ISO-8859-1 (the HTTP header says so; no meta in the page), so straight quotes only.
POMPE_HTML = """<!DOCTYPE html>
<html lang="fr"><head><title>Comment fonctionne une pompe à chaleur ? - Maison Énergie</title></head>
<body>
<div id="menu"><a href="/">Accueil</a> <a href="/guide/">Guides</a> <a href="/aides/">Aides et primes</a> <a href="/artisans/">Trouver un artisan</a></div>
<div id="rgpd">Nous utilisons des cookies pour mesurer l'audience. <a href="/cookies">Paramétrer</a> <button>Accepter</button></div>
<div class="contenu">
<h1>Comment fonctionne une pompe à chaleur ?</h1>
<p>Une pompe à chaleur a quelque chose de paradoxal : elle réchauffe une maison en prélevant de la chaleur dans l'air extérieur, même lorsqu'il fait froid dehors. Cela semble défier le bon sens, et pourtant le principe est exactement celui du réfrigérateur de votre cuisine, simplement utilisé dans l'autre sens.</p>
<h2>Un fluide qui transporte la chaleur</h2>
<p>Au coeur de l'appareil circule un fluide frigorigène qui s'évapore à très basse température. Dans l'unité extérieure, ce fluide passe dans un échangeur où il capte les calories de l'air, même à moins dix degrés, et se transforme en gaz. Un compresseur électrique comprime ensuite ce gaz, ce qui fait fortement monter sa température. Dans l'unité intérieure, le gaz chaud cède sa chaleur à l'eau du chauffage ou à l'air de la pièce, redevient liquide, puis repart vers l'extérieur pour recommencer le cycle.</p>
<h2>Pourquoi parle-t-on de rendement supérieur à 100 % ?</h2>
<p>Le compresseur consomme de l'électricité, mais il ne fabrique pas la chaleur : il la déplace. Pour un kilowattheure d'électricité consommé, une bonne pompe à chaleur restitue souvent trois à quatre kilowattheures de chaleur. C'est ce qu'on appelle le coefficient de performance, ou COP. Il baisse quand l'air extérieur devient très froid, c'est pourquoi une maison bien isolée et des radiateurs basse température sont les meilleurs alliés de ce type d'installation.</p>
<p>Avant de vous lancer, faites réaliser une étude thermique : une pompe mal dimensionnée fonctionne mal, s'use vite et déçoit. Bien choisie, en revanche, elle peut diviser la facture de chauffage par deux ou trois par rapport à des convecteurs électriques.</p>
</div>
<div class="lire-aussi"><a href="/guide/isolation-combles">Isoler ses combles : par où commencer ?</a></div>
<div id="pied">© 2024 Maison Énergie - <a href="/mentions">Mentions légales</a></div>
</body></html>
"""

CAMINO_HTML = """<!DOCTYPE html>
<html lang="es"><head><meta charset="utf-8"><title>Etapa Sarria – Portomarín del Camino Francés | Caminando</title>
<script src="/js/mapa.js"></script></head>
<body>
<nav><a href="/">Inicio</a> · <a href="/etapas/">Etapas</a> · <a href="/albergues/">Albergues</a> · <a href="/equipaje/">Qué llevar</a> · <a href="/foro/">Foro</a></nav>
<div class="cookies">Este sitio usa cookies. <a href="/cookies">Más información</a> <button>Aceptar</button></div>
<div class="etapa">
<h1>Etapa Sarria – Portomarín: la puerta de los últimos cien kilómetros</h1>
<p>Sarria es el punto de partida más popular del Camino de Santiago, porque desde aquí se recorren los cien kilómetros mínimos que exige la catedral para entregar la Compostela. Por eso, quien viene caminando desde Roncesvalles o León nota enseguida el cambio: de repente los senderos se llenan de peregrinos nuevos, con mochilas limpias y botas recién estrenadas.</p>
<p>La etapa tiene unos veintidós kilómetros y es de las más bonitas de Galicia. El camino sale de la ciudad por una escalinata de piedra, cruza un pequeño puente medieval y se adentra en un paisaje de robles, castaños y muros de piedra cubiertos de musgo. Las aldeas se suceden cada pocos kilómetros, así que nunca falta un bar donde sellar la credencial y tomar un café con leche.</p>
<h2>Consejos para la etapa</h2>
<ul><li>Sal temprano: a partir de las nueve el camino está muy concurrido.</li><li>Lleva chubasquero incluso en verano; en Galicia la lluvia llega sin avisar.</li><li>En el mojón del kilómetro cien casi todo el mundo se para a hacerse una foto.</li></ul>
<p>La llegada a Portomarín es espectacular. El pueblo original quedó bajo las aguas del embalse de Belesar en los años sesenta, y muchos de sus edificios se trasladaron piedra a piedra a lo alto de la colina, entre ellos la iglesia fortaleza de San Nicolás. Después de cruzar el largo puente sobre el río Miño, todavía queda subir una escalera empinada, el último esfuerzo del día antes de la ducha y el pulpo.</p>
</div>
<footer>© 2024 Caminando · <a href="/aviso-legal">Aviso legal</a></footer>
</body></html>
"""

# Served as windows-1251 (header and meta agree).
NEBO_HTML = """<!DOCTYPE html>
<html lang="ru"><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1251">
<title>Почему небо голубое, а закат красный? — Наука просто</title></head>
<body>
<div class="menu"><a href="/">Главная</a> <a href="/fizika/">Физика</a> <a href="/himiya/">Химия</a> <a href="/kosmos/">Космос</a> <a href="/voprosy/">Вопросы читателей</a></div>
<div class="cookie">Сайт использует cookie. <button>Хорошо</button></div>
<div class="text">
<h1>Почему небо голубое, а закат красный?</h1>
<p>Этот вопрос задают почти все дети, и далеко не каждый взрослый может на него ответить. Солнечный свет кажется нам белым, но на самом деле он состоит из всех цветов радуги. Проходя через атмосферу, этот свет сталкивается с молекулами азота и кислорода, которые гораздо меньше длины световой волны.</p>
<p>Такие маленькие частицы рассеивают свет неодинаково: короткие волны, синие и фиолетовые, рассеиваются намного сильнее, чем длинные красные. Это явление называют рэлеевским рассеянием. В результате синий свет разлетается по всему небу и попадает нам в глаза со всех сторон, поэтому небо и кажется голубым. Фиолетового света в солнечном спектре меньше, к тому же наши глаза к нему менее чувствительны, и потому небо не выглядит фиолетовым.</p>
<h2>А что происходит на закате?</h2>
<p>Когда солнце опускается к горизонту, его лучам приходится проходить через гораздо более толстый слой воздуха. По дороге почти весь синий свет успевает рассеяться в стороны, и до наблюдателя доходят в основном оранжевые и красные лучи. Если в воздухе много пыли или дыма, закаты становятся особенно яркими. Кстати, на Марсе всё наоборот: из-за мелкой пыли днём небо там желтовато-розовое, а закат голубоватый.</p>
</div>
<div class="footer">© 2024 Наука просто. <a href="/o-proekte/">О проекте</a></div>
</body></html>
"""

LVCHA_HTML = """<!DOCTYPE html>
<html lang="zh-CN"><head><meta charset="utf-8"><title>在家泡好一杯绿茶的五个要点 - 茶事</title></head>
<body>
<div class="nav"><a href="/">首页</a> <a href="/guide/">泡茶指南</a> <a href="/chaju/">茶具</a> <a href="/chanqu/">名茶产区</a> <a href="/shop/">商城</a></div>
<div class="cookie">本网站使用Cookie以提供更好的服务。<button>我知道了</button></div>
<div class="article">
<h1>在家泡好一杯绿茶的五个要点</h1>
<p>很多朋友买了好茶，回家一泡却觉得又苦又涩，其实问题往往不在茶叶，而在冲泡的方法。绿茶属于不发酵茶，芽叶细嫩，对水温和时间都比较敏感。掌握下面几个要点，普通的茶叶也能泡出清香鲜爽的味道。</p>
<h2>一、水温不要太高</h2>
<p>冲泡绿茶的水温一般在八十度左右最合适。刚烧开的水会把嫩芽烫熟，不仅颜色发黄，香气也会变得沉闷。可以把开水先倒进公道杯里放一两分钟，等温度稍微降下来再冲泡。</p>
<h2>二、选择合适的器具</h2>
<p>玻璃杯最适合冲泡细嫩的绿茶，不但散热快，还能欣赏茶叶在水中慢慢舒展的样子。如果用盖碗，泡的时候最好不要一直盖着盖子，以免闷出熟汤味。</p>
<h2>三、茶叶用量和时间</h2>
<p>一般来说，一百五十毫升的水配三克左右的茶叶就够了。第一泡大约浸泡一分钟即可出汤，之后每一泡适当延长十几秒。不要让茶叶长时间泡在水里，否则茶汤会越来越苦。</p>
<h2>四、先注水还是先投茶</h2>
<p>对于特别细嫩的茶，可以先在杯中注入三分之一的水，再放入茶叶，待茶叶吸水下沉后再加满，这种方法叫做中投法。外形紧结的茶则可以先放茶叶，再沿杯壁缓缓注水。</p>
<h2>五、注意保存</h2>
<p>绿茶最怕潮湿、高温和异味。开封后的茶叶应当密封好，放在阴凉干燥的地方，量多的话可以放进冰箱冷藏，但一定要避免和其他食物放在一起。</p>
</div>
<div class="footer">© 2024 茶事 版权所有</div>
</body></html>
"""

SAKURA_HTML = """<!DOCTYPE html>
<html lang="ja"><head><meta charset="utf-8"><title>川沿いの桜まつり、四年ぶりに屋台が復活 | まちのニュース</title></head>
<body>
<div class="gnav"><a href="/">トップ</a> <a href="/local/">地域</a> <a href="/event/">イベント</a> <a href="/gourmet/">グルメ</a> <a href="/weather/">天気</a></div>
<div class="cookie-bar">このサイトはクッキーを使用しています。<button>閉じる</button></div>
<div class="kiji">
<h1>川沿いの桜まつり、四年ぶりに屋台が復活</h1>
<p>市内を流れる川沿いの遊歩道で、毎年恒例の桜まつりが六日から始まった。感染症対策のため中止や規模の縮小が続いていたが、今年は四年ぶりに屋台の出店が認められ、初日から多くの家族連れや観光客でにぎわった。</p>
<p>遊歩道にはおよそ三百本のソメイヨシノが植えられており、今年は平年より少し早く満開を迎えた。会場には焼きそばやたこ焼き、地元の農家が育てたいちごを使ったお菓子など、四十を超える屋台が並んだ。夕方からは提灯に明かりがともり、川面に映る夜桜を写真に収める人の姿が目立った。</p>
<p>実行委員会の田中会長は「屋台が戻ってきて、ようやく本来のお祭りの雰囲気になった。地域の人たちが顔を合わせる場所として、これからも続けていきたい」と話した。まつりは十四日まで開かれ、週末には地元の高校の吹奏楽部による演奏会や、子ども向けの絵画コンテストも予定されている。</p>
<p>会場周辺には駐車場がないため、実行委員会は公共交通機関の利用を呼びかけている。</p>
</div>
<div class="footer">Copyright (C) まちのニュース編集部</div>
</body></html>
"""

COLHEITA_HTML = """<!DOCTYPE html>
<html lang="pt-BR"><head><meta charset="utf-8"><title>Como é feita a colheita do café no Sul de Minas | Café com Prosa</title></head>
<body>
<nav><a href="/">Início</a> | <a href="/blog/">Blog</a> | <a href="/cafes/">Nossos cafés</a> | <a href="/loja/">Loja</a> | <a href="/contato/">Contato</a></nav>
<div class="aviso">Usamos cookies para melhorar sua experiência. <button>Concordo</button></div>
<div class="post">
<h1>Como é feita a colheita do café no Sul de Minas</h1>
<p>Entre maio e setembro, as fazendas do Sul de Minas Gerais vivem a época mais movimentada do ano. É a safra do café, quando os frutos vermelhos e amarelos, chamados de cerejas, estão maduros e precisam ser colhidos antes que sequem no pé ou caiam no chão.</p>
<p>Nas áreas mais planas, a colheita é feita por máquinas que passam sobre as fileiras e sacodem os galhos com hastes vibratórias. Já nas encostas íngremes, tão comuns na região, o trabalho continua sendo manual. Os colhedores estendem panos embaixo dos pés de café e derriçam os grãos com as mãos, um trabalho cansativo que exige experiência para não machucar a planta.</p>
<p>Depois de colhido, o café segue para o terreiro, onde é espalhado ao sol e revolvido várias vezes por dia com rodos de madeira. A secagem pode levar de dez a vinte dias, dependendo do clima. Alguns produtores preferem retirar a casca antes de secar, produzindo o chamado cereja descascado, que costuma ter uma bebida mais limpa e adocicada.</p>
<p>Por fim, os grãos secos descansam em tulhas de madeira por algumas semanas antes de serem beneficiados, classificados e provados. Só então se sabe se o trabalho de um ano inteiro resultou em um café comum ou em um lote especial.</p>
</div>
<footer>© 2024 Café com Prosa</footer>
</body></html>
"""

MOESTUIN_HTML = """<!DOCTYPE html>
<html lang="nl"><head><meta charset="utf-8"><title>Buurtmoestuin achter het station krijgt eerste oogst | Wijkkrant Oost</title></head>
<body>
<div class="menu"><a href="/">Home</a> <a href="/nieuws/">Nieuws</a> <a href="/agenda/">Agenda</a> <a href="/verenigingen/">Verenigingen</a> <a href="/adverteren/">Adverteren</a></div>
<div class="cookies">Deze site gebruikt cookies. <button>Akkoord</button></div>
<div class="bericht">
<h1>Buurtmoestuin achter het station levert eerste oogst op</h1>
<p>Waar een jaar geleden nog een verwilderd braakliggend terrein lag, staan nu rijen sla, bonen en courgettes. De buurtmoestuin achter het station, opgezet door een groep bewoners uit de wijk, heeft deze zomer haar eerste echte oogst binnengehaald.</p>
<p>Het idee ontstond tijdens een bewonersavond, vertelt initiatiefnemer Fatima El Amrani. "Veel mensen hier wonen in een flat zonder tuin. We wilden een plek waar je samen iets kunt laten groeien en waar kinderen zien dat tomaten niet in de supermarkt ontstaan." De gemeente stelde de grond voor vijf jaar beschikbaar en een bouwmarkt schonk hout voor de plantenbakken.</p>
<p>Inmiddels doen ruim veertig huishoudens mee. Iedereen heeft een eigen bak, maar het onderhoud van de paden, de composthoop en de regentonnen gebeurt samen, op zaterdagochtend. Wat over is, gaat naar de voedselbank in het wijkcentrum. Deze maand waren dat al meer dan tachtig kilo groenten.</p>
<p>Volgend voorjaar wil de groep een kas bouwen en een bijenhotel plaatsen. Wie wil helpen of een bak wil huren, kan op zaterdag tussen tien en twaalf uur gewoon langskomen.</p>
</div>
<div class="voet">© 2024 Wijkkrant Oost</div>
</body></html>
"""

NOT_FOUND_HTML = """<!DOCTYPE html>
<html><head><title>404 Not Found | The Harbour Times</title></head>
<body><h1>Page not found</h1><p>Sorry, the page you were looking for has moved or no longer exists.</p>
<p><a href="/">Return to the homepage</a> or try searching the archive.</p></body></html>
"""

GARDEN_TXT = """Community Garden Tool Shed - How It Works
=========================================

The tool shed by the north gate is shared by every plot holder. It works on trust, so
please read these notes once and keep to them.

The shed is open from eight in the morning until dusk. The combination for the padlock is
given out at the spring meeting and changes every year. Please do not write it on the door.

Borrowing tools: take what you need, write your plot number and the tool on the sheet on
the clipboard, and cross it off when you bring it back. Tools should be back in the shed by
the end of the day. Spades and forks go on the left wall, rakes and hoes on the right, and
small hand tools in the labelled crates under the bench.

Cleaning: knock the soil off tools before returning them. A stiff brush and a bucket are
kept by the water butt. If something breaks, do not hide it in the corner; put it on the
"repair" shelf and leave a note. Most things can be fixed at the monthly work morning.

Shared supplies: the compost bins, canes and netting are free to use. Seed potatoes and
fertiliser are bought in bulk each February and sold at cost; the price list is pinned
inside the door.

The wheelbarrow with the green handles has a slow puncture. It still works, but pump it up
first.

Thank you for looking after the shed. It only works because everybody does their bit.
"""


def tiny_png() -> bytes:
    """A valid 1x1 PNG (one teal pixel), built by hand so it is deterministic."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\x2a\x9d\x8f", 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def tiny_pdf() -> bytes:
    """A minimal one-page PDF whose page says a few words; the pipeline must skip it."""
    stream = b"BT /F1 18 Tf 72 720 Td (Renovation guide 2024) Tj ET"
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(out.tell())
        out.write(f"{i} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode())
    for off in offsets:
        out.write(f"{off:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


# (url, date, status line, content-type header or None, body bytes)
CAPTURES = [
    (
        "http://www.harbourtimes.example/news/2024/03/ferry-returns",
        "2024-03-12T09:14:03Z",
        "200 OK",
        "text/html; charset=utf-8",
        FERRY_HTML.encode("utf-8"),
    ),
    (
        "http://www.kuchenliebe.example/rezepte/versunkener-apfelkuchen",
        "2024-03-12T09:14:41Z",
        "200 OK",
        "text/html; charset=UTF-8",
        APFELKUCHEN_HTML.encode("utf-8"),
    ),
    (
        "http://www.maison-energie.example/guide/pompe-a-chaleur",
        "2024-03-12T09:15:10Z",
        "200 OK",
        "text/html; charset=ISO-8859-1",
        POMPE_HTML.encode("iso-8859-1"),
    ),
    (
        "http://www.harbourtimes.example/static/img/logo.png",
        "2024-03-12T09:15:12Z",
        "200 OK",
        "image/png",
        tiny_png(),
    ),
    (
        "http://www.caminando.example/etapas/sarria-portomarin",
        "2024-03-12T09:16:02Z",
        "200 OK",
        "text/html",
        CAMINO_HTML.encode("utf-8"),
    ),
    (
        "http://nauka-prosto.example/fizika/pochemu-nebo-goluboe",
        "2024-03-12T09:16:47Z",
        "200 OK",
        "text/html; charset=windows-1251",
        NEBO_HTML.encode("cp1251"),
    ),
    (
        "http://www.maison-energie.example/docs/guide-renovation-2024.pdf",
        "2024-03-12T09:17:05Z",
        "200 OK",
        "application/pdf",
        tiny_pdf(),
    ),
    (
        "http://www.chashi.example/guide/lvcha-chongpao",
        "2024-03-12T09:17:30Z",
        "200 OK",
        "text/html; charset=utf-8",
        LVCHA_HTML.encode("utf-8"),
    ),
    (
        "http://www.machi-news.example/local/2024/03/sakura-matsuri",
        "2024-03-12T09:18:11Z",
        "200 OK",
        "text/html; charset=UTF-8",
        SAKURA_HTML.encode("utf-8"),
    ),
    (
        "http://files.greenhill-garden.example/shed/README.txt",
        "2024-03-12T09:18:40Z",
        "200 OK",
        "text/plain; charset=utf-8",
        GARDEN_TXT.encode("utf-8"),
    ),
    (
        "http://www.harbourtimes.example/news/2019/01/pier-lights-switched-on",
        "2024-03-12T09:19:02Z",
        "404 Not Found",
        "text/html; charset=utf-8",
        NOT_FOUND_HTML.encode("utf-8"),
    ),
    (
        "http://www.cafecomprosa.example/blog/colheita-do-cafe",
        "2024-03-12T09:19:33Z",
        "200 OK",
        "text/html; charset=utf-8",
        COLHEITA_HTML.encode("utf-8"),
    ),
    (
        "http://www.wijkkrant-oost.example/nieuws/buurtmoestuin-eerste-oogst",
        "2024-03-12T09:20:15Z",
        "200 OK",
        "text/html; charset=utf-8",
        MOESTUIN_HTML.encode("utf-8"),
    ),
    (
        "http://www.harbourtimes.example/amp/news/2024/03/ferry-returns",
        "2024-03-13T08:20:51Z",
        "200 OK",
        "text/html; charset=utf-8",
        FERRY_AMP_HTML.encode("utf-8"),
    ),
]

WARC_FILENAME = "crawl.warc.gz"
WARCINFO = (
    "software: tokenmill scripts/make_sample.py\r\n"
    "format: WARC File Format 1.0\r\n"
    "conformsTo: http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.0/\r\n"
    "description: tokenmill bundled sample crawl (synthetic; all text written for the project)\r\n"
    "robots: classic\r\n"
    "isPartOf: tokenmill-sample\r\n"
)
USER_AGENT = "tokenmill-sample-bot/0.1 (+https://example.org/tokenmill)"


def write_warc(out: Path) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True, warc_version="WARC/1.0")

    info_id = record_id("warcinfo")
    info = writer.create_warc_record(
        "",
        "warcinfo",
        payload=io.BytesIO(WARCINFO.encode("utf-8")),
        warc_content_type="application/warc-fields",
        warc_headers_dict={
            "WARC-Record-ID": info_id,
            "WARC-Date": "2024-03-12T09:14:00Z",
            "WARC-Filename": WARC_FILENAME,
        },
    )
    writer.write_record(info)

    for n, (url, date, status, ctype, body) in enumerate(CAPTURES):
        host = url.split("/")[2]
        path = "/" + url.split("/", 3)[3]
        resp_id = record_id(f"response:{n}:{url}")
        req_id = record_id(f"request:{n}:{url}")
        meta_id = record_id(f"metadata:{n}:{url}")

        req_headers = StatusAndHeaders(
            f"GET {path} HTTP/1.1",
            [
                ("Host", host),
                ("User-Agent", USER_AGENT),
                ("Accept", "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.8"),
                ("Accept-Encoding", "identity"),
                ("Connection", "close"),
            ],
            is_http_request=True,
        )
        resp_headers = [
            ("Date", _http_date(date)),
            ("Server", "nginx"),
        ]
        if ctype is not None:
            resp_headers.append(("Content-Type", ctype))
        resp_headers += [("Content-Length", str(len(body))), ("Connection", "close")]
        resp_http = StatusAndHeaders(status, resp_headers, protocol="HTTP/1.1")

        common = {"WARC-Date": date, "WARC-Warcinfo-ID": info_id}
        response = writer.create_warc_record(
            url,
            "response",
            payload=io.BytesIO(body),
            length=len(body),
            http_headers=resp_http,
            warc_headers_dict={**common, "WARC-Record-ID": resp_id, "WARC-IP-Address": f"192.0.2.{20 + n}"},
        )
        request = writer.create_warc_record(
            url,
            "request",
            payload=io.BytesIO(b""),
            length=0,
            http_headers=req_headers,
            warc_headers_dict={**common, "WARC-Record-ID": req_id, "WARC-Concurrent-To": resp_id},
        )
        fetch_ms = 80 + (n * 37) % 400
        meta_body = f"fetchTimeMs: {fetch_ms}\r\nhttpCharset: {_charset_of(ctype)}\r\n".encode("utf-8")
        metadata = writer.create_warc_record(
            url,
            "metadata",
            payload=io.BytesIO(meta_body),
            length=len(meta_body),
            warc_content_type="application/warc-fields",
            warc_headers_dict={**common, "WARC-Record-ID": meta_id, "WARC-Concurrent-To": resp_id},
        )
        writer.write_record(request)
        writer.write_record(response)
        writer.write_record(metadata)

    (out / WARC_FILENAME).write_bytes(buf.getvalue())


def _charset_of(ctype: str | None) -> str:
    if ctype and "charset=" in ctype:
        return ctype.split("charset=", 1)[1].strip()
    return "none"


def _http_date(iso: str) -> str:
    import datetime as dt
    from email.utils import format_datetime

    d = dt.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    return format_datetime(d, usegmt=True)


# ---------------------------------------------------------------------------------------
# docs.jsonl
# ---------------------------------------------------------------------------------------

POOL_NOTICE = (
    "Eastfield Lido reopens for the summer season\n\n"
    "After a winter of repairs, Eastfield Lido will open its gates again on Saturday. The fifty-metre "
    "outdoor pool has been drained, resurfaced and fitted with new filters, and the changing rooms have "
    "finally been given the hot showers that regular swimmers have been asking for since the nineteen-nineties.\n\n"
    "The water will be heated to around twenty-four degrees, which the volunteers who run the lido describe as "
    '"bracing but friendly". Early morning lane swimming starts at half past six on weekdays, and families '
    "have the whole pool to themselves on Sunday afternoons. Lifeguards will be on duty at all times.\n\n"
    "The café by the deep end is under new management this year and will serve hot drinks, toast and ice "
    "cream. Bicycle racks have been moved closer to the entrance, and there is now a small lockable room "
    "for pushchairs.\n\n"
    "Season tickets can be bought at the kiosk from Saturday. The trust that runs the lido thanks everyone "
    "who donated to the repair fund, which raised more than it needed in under three months.\n\n"
    "{footer}"
)
POOL_A = POOL_NOTICE.format(footer="Published by the Eastfield Lido Trust, 24 May 2024.")
# Near-duplicate 1: one sentence changed.
POOL_B = POOL_NOTICE.replace(
    "Early morning lane swimming starts at half past six on weekdays,",
    "Early morning lane swimming starts at seven o'clock on weekdays,",
).format(footer="Published by the Eastfield Lido Trust, 24 May 2024.")
# Near-duplicate 2: a different footer and date line.
POOL_C = POOL_NOTICE.format(
    footer="Updated 27 May 2024. Shared from the Eastfield community newsletter - forward it to a friend!"
)

STADTFEST = (
    "Stadtfest am Marktplatz: Drei Tage Musik, Essen und Flohmarkt\n\n"
    "Vom Freitag bis Sonntag verwandelt sich der Marktplatz wieder in eine große Festmeile. Auf der Bühne vor "
    "dem Rathaus spielen an allen drei Abenden Bands aus der Region, am Samstagnachmittag tritt außerdem der "
    "Kinderchor der Musikschule auf. Rund um den Brunnen bieten Vereine und Gastronomen Flammkuchen, Bratwurst, "
    "vegetarische Gerichte und hausgemachten Kuchen an.\n\n"
    "Neu ist in diesem Jahr der Flohmarkt in der Kirchgasse. Wer einen Stand aufbauen möchte, kann sich bis "
    "Mittwoch im Bürgerbüro anmelden; die Standgebühr wird an die Tafel gespendet. Die Innenstadt ist während "
    "des Festes für Autos gesperrt, die Busse fahren über die Umleitung am Bahnhof.\n\n"
    "{ende}"
)
STADTFEST_A = STADTFEST.format(ende="Der Eintritt ist frei. Das Fest beginnt am Freitag um 17 Uhr.")
STADTFEST_B = STADTFEST.replace(
    "spielen an allen drei Abenden Bands aus der Region",
    "spielen an allen drei Abenden Bands aus der Umgebung",
).format(ende="Der Eintritt ist frei. Das Fest beginnt am Freitag um 18 Uhr mit dem Fassanstich.")

TOMATES = (
    "Cómo cultivar tomates en el balcón\n\n"
    "No hace falta tener un huerto para comer tomates recién cogidos. Un balcón que reciba al menos seis horas "
    "de sol al día es suficiente para dos o tres plantas, siempre que se elija bien la variedad y el recipiente. "
    "Las variedades de tipo cherry son las más agradecidas: crecen rápido, producen mucho y toleran mejor los "
    "descuidos.\n\n"
    "Usa macetas de al menos veinte litros, con agujeros de drenaje, y un sustrato rico en materia orgánica. "
    "Planta el tomate más hondo de lo que venía en el semillero, porque el tallo enterrado echa raíces nuevas y "
    "la planta se vuelve más fuerte. Coloca un tutor desde el primer día y ve atando el tallo a medida que crece.\n\n"
    "El riego es la parte más delicada. En verano las macetas se secan deprisa, pero el exceso de agua favorece "
    "los hongos. Lo ideal es regar por la mañana, directamente sobre la tierra y sin mojar las hojas. Si los "
    "frutos se agrietan, suele ser señal de riegos irregulares. Con un poco de constancia, a mediados de julio "
    "tendrás tus primeros tomates."
)

DOCS: list[dict] = [
    {
        "id": "doc-en-001",
        "url": "https://www.example.org/blog/backyard-hens",
        "text": (
            "What I learned from keeping three backyard hens\n\n"
            "When we brought home three hens two springs ago, I assumed the hard part would be building the coop. "
            "It turned out the coop was the easy bit. The real lessons were about routine, patience and the "
            "surprising personalities of birds that most people think of as interchangeable.\n\n"
            "The first thing you notice is how much they like a schedule. Ours wait by the door of the run at first "
            "light and grumble loudly if breakfast is late. In the evening they put themselves to bed as the light "
            "fades, which makes closing the coop against foxes much simpler than I expected.\n\n"
            "The second lesson was about space. Three hens can turn a patch of lawn into bare earth in a few weeks, "
            "so we now move the run every fortnight and give them a corner of the vegetable bed in autumn, where they "
            "happily dig out grubs and weeds. In return, the soil there is the best in the garden.\n\n"
            "Finally, the eggs. In summer we get two or three a day, in midwinter almost none, and that rhythm has "
            "changed how we cook. Eggs feel seasonal now, like strawberries. I would recommend hens to anyone with a "
            "small garden and a neighbour willing to feed them during holidays."
        ),
    },
    {
        "id": "doc-en-002",
        "url": "https://www.example.org/history/library-card",
        "text": (
            "A short history of the library card\n\n"
            "For most of history, borrowing a book meant being known personally to the person who owned it. Early "
            "lending libraries in the eighteenth century were usually subscription clubs: members paid a yearly fee "
            "and signed a ledger when they took a volume home. The idea of a free public library, open to anyone who "
            "lived in a town, only spread widely in the second half of the nineteenth century.\n\n"
            "Free access created a new problem. Librarians needed a way to record who had which book without writing "
            "long entries in a ledger for every loan. The solution was the card: a small piece of stiff paper that "
            "identified the borrower, paired with a slip kept in a pocket inside each book. When a book went out, "
            "the slip was stamped with a due date and filed, and the pattern of stamps on the inside cover became "
            "a record of the book's life.\n\n"
            "Over the twentieth century, cards gained photographs, then barcodes, and finally chips. The pockets and "
            "date stamps have mostly disappeared, but the basic promise of the card has not changed: show it at the "
            "desk, and the whole collection is yours to borrow."
        ),
    },
    {
        "id": "doc-en-003",
        "url": "https://www.example.org/explainers/noise-cancelling",
        "text": (
            "How do noise-cancelling headphones work?\n\n"
            "Sound is a wave of pressure travelling through the air. When two waves meet, they add together: if the "
            "peaks of one line up with the troughs of the other, they cancel out. Active noise cancellation uses this "
            "simple fact.\n\n"
            "Small microphones on the outside of each ear cup listen to the sound around you. A chip inside the "
            "headphones analyses that sound and, within a fraction of a millisecond, produces a mirror image of it, "
            "a wave with the same shape but inverted. The speaker plays this inverted wave along with your music, and "
            "inside your ear canal the two versions of the background noise largely cancel each other.\n\n"
            "The technique works best on steady, low-pitched sounds such as the drone of an aircraft engine or the "
            "hum of an air conditioner, because these change slowly and are easy to predict. Sudden, high-pitched "
            "noises like a baby crying or a door slamming are much harder to cancel in time. That is why good "
            "headphones also rely on passive isolation: well-fitting cushions that physically block the higher "
            "frequencies before they reach your ears."
        ),
    },
    {
        "id": "doc-en-004",
        "url": "https://www.example.org/tutorials/python-venv",
        "text": (
            "Setting up a Python virtual environment\n\n"
            "A virtual environment keeps the packages for one project separate from everything else on your machine. "
            "This guide was tested with Python 3.11.2 on 2024-05-01 and should work with any version from 3.8 onwards.\n\n"
            "Open a terminal in your project folder and run:\n\n"
            "    python3 -m venv .venv\n"
            "    source .venv/bin/activate\n"
            "    pip install requests==2.31.0\n\n"
            "After activation, your prompt shows the name of the environment, and the python and pip commands refer "
            "to the copies inside .venv. To leave the environment, type deactivate. If you upgrade Python from 3.11 "
            "to 3.12, delete the folder and create it again rather than trying to repair it.\n\n"
            "Keep a requirements.txt file in the project so that others can rebuild the same environment with "
            "pip install -r requirements.txt. A good habit is to pin exact versions, for example numpy==1.26.4, and "
            "to update them deliberately instead of letting them drift."
        ),
    },
    {"id": "doc-en-005", "url": "https://eastfield-lido.example/news/reopening", "text": POOL_A},
    {"id": "doc-en-006", "url": "https://eastfield-lido.example/news/reopening?print=1", "text": POOL_B},
    {"id": "doc-en-007", "url": "https://newsletter.eastfield.example/2024/05/lido", "text": POOL_C},
    {
        "id": "doc-de-001",
        "url": "https://www.example.de/ratgeber/energie-sparen",
        "text": (
            "Energie sparen im Haushalt: Kleine Gewohnheiten, große Wirkung\n\n"
            "Wer seine Stromrechnung senken möchte, muss nicht gleich neue Geräte kaufen. Oft reichen ein paar "
            "Gewohnheiten, die kaum Mühe kosten. Ein gutes Beispiel ist der Wasserkocher: Wer nur so viel Wasser "
            "erhitzt, wie er tatsächlich braucht, spart über das Jahr eine überraschend große Menge Energie.\n\n"
            "Auch beim Kühlschrank lohnt sich ein Blick auf die Einstellung. Sieben Grad im mittleren Fach sind völlig "
            "ausreichend, jedes Grad kälter erhöht den Verbrauch spürbar. Das Gefrierfach sollte regelmäßig abgetaut "
            "werden, denn eine dicke Eisschicht wirkt wie eine Dämmung an der falschen Stelle.\n\n"
            "Viele Geräte verbrauchen außerdem Strom, obwohl sie scheinbar ausgeschaltet sind. Fernseher, Spielkonsolen "
            "und Ladegeräte im Bereitschaftsmodus summieren sich schnell. Eine schaltbare Steckdosenleiste hilft, "
            "alles mit einem Handgriff vom Netz zu trennen. Beim Waschen gilt: Die meisten Textilien werden bei "
            "dreißig oder vierzig Grad sauber, und eine voll beladene Maschine ist effizienter als zwei halbe."
        ),
    },
    {
        "id": "doc-de-002",
        "url": "https://www.stadt-beispiel.example/aktuelles/stadtfest",
        "text": STADTFEST_A,
    },
    {"id": "doc-de-003", "url": "https://www.lokalblatt.example/region/stadtfest-2024", "text": STADTFEST_B},
    {
        "id": "doc-fr-001",
        "url": "https://www.example.fr/conseils/compost-appartement",
        "text": (
            "Faire son compost en appartement, c'est possible\n\n"
            "On imagine souvent le compost au fond d'un grand jardin, mais il existe des solutions adaptées aux "
            "logements sans extérieur. La plus répandue est le lombricomposteur : une petite tour de bacs empilés dans "
            "laquelle des vers transforment les épluchures en un terreau très riche.\n\n"
            "Contrairement à ce que l'on pourrait craindre, un lombricomposteur bien entretenu ne sent pas mauvais. "
            "Il suffit d'éviter la viande, le poisson, les produits laitiers et les agrumes en grande quantité, et "
            "d'ajouter régulièrement un peu de carton déchiré pour équilibrer l'humidité. Les vers travaillent en "
            "silence et se contentent d'un coin à l'abri du soleil, sous un évier ou sur un balcon protégé du gel.\n\n"
            "Au bout de quelques mois, on récupère un compost sombre et léger, idéal pour les plantes d'intérieur ou "
            "les jardinières. On obtient aussi un liquide, le « thé de vers », qui se dilue dans l'eau d'arrosage. "
            "Beaucoup de communes proposent désormais des ateliers gratuits pour bien démarrer."
        ),
    },
    {
        "id": "doc-fr-002",
        "url": "https://www.example.fr/histoire/premier-metro",
        "text": (
            "Juillet 1900 : le premier métro de Paris\n\n"
            "Le 19 juillet 1900, en pleine Exposition universelle, les Parisiens découvrent un mode de transport "
            "entièrement nouveau pour eux. La première ligne du métropolitain relie la porte de Vincennes à la porte "
            "Maillot en traversant la ville d'est en ouest, sous la rue de Rivoli et les Champs-Élysées.\n\n"
            "Les travaux avaient été menés à un rythme impressionnant sous la direction de l'ingénieur Fulgence "
            "Bienvenüe, qui avait choisi de creuser à faible profondeur, juste sous la chaussée, pour aller plus vite. "
            "Les premières voitures étaient en bois, éclairées à l'électricité, et les voyageurs pouvaient choisir "
            "entre la première et la deuxième classe.\n\n"
            "Le succès est immédiat. En quelques mois, des millions de voyageurs empruntent la ligne, et de nouveaux "
            "chantiers s'ouvrent partout dans la capitale. Les entrées dessinées par l'architecte Hector Guimard, avec "
            "leurs lampes en forme de fleurs, deviennent bientôt l'un des symboles de la ville."
        ),
    },
    {
        "id": "doc-es-001",
        "url": "https://www.example.es/historia/reloj-puerta-del-sol",
        "text": (
            "El reloj de la Puerta del Sol y las doce campanadas\n\n"
            "Cada 31 de diciembre, millones de personas en toda España miran el mismo reloj mientras se preparan "
            "para comer doce uvas. El reloj de la Real Casa de Correos, en la Puerta del Sol de Madrid, fue un regalo "
            "del relojero José Rodríguez Losada, que lo construyó en Londres y lo instaló en 1866.\n\n"
            "La costumbre de las uvas es algo más reciente de lo que muchos creen. Aunque hay referencias anteriores, "
            "se popularizó a principios del siglo veinte, cuando algunos productores de Alicante tuvieron una cosecha "
            "especialmente abundante y encontraron en la Nochevieja una buena ocasión para venderla.\n\n"
            "Desde que la televisión empezó a retransmitir las campanadas, la tradición se ha vuelto casi obligatoria. "
            "Los más prudentes compran uvas pequeñas y sin pepitas, porque seguir el ritmo de una campanada cada tres "
            "segundos es más difícil de lo que parece."
        ),
    },
    {"id": "doc-es-002", "url": "https://www.example.es/huerto/tomates-balcon", "text": TOMATES},
    {"id": "mirror-es-002", "url": "https://espejo.example.net/huerto/tomates-balcon", "text": TOMATES},
    {
        "id": "doc-it-001",
        "url": "https://www.example.it/storia/espresso",
        "text": (
            "Breve storia del caffè espresso\n\n"
            "L'espresso nasce dall'esigenza di preparare il caffè in fretta, una tazza alla volta, per i clienti dei "
            "bar delle grandi città italiane all'inizio del Novecento. Le prime macchine, alte e lucenti come piccole "
            "locomotive, usavano il vapore per spingere l'acqua attraverso la polvere di caffè. Il risultato era "
            "rapido, ma spesso amaro e bruciato.\n\n"
            "La vera svolta arriva nel secondo dopoguerra, con le macchine a leva. Il barista caricava una molla "
            "tirando una lunga leva, e la molla spingeva poi l'acqua calda ad alta pressione attraverso il caffè. "
            "Fu così che comparve la crema, quella schiuma color nocciola che oggi consideriamo il segno di un buon "
            "espresso.\n\n"
            "Da allora il rito non è cambiato molto. Al bar lo si beve in piedi, al banco, in pochi sorsi, spesso "
            "accompagnato da un bicchiere d'acqua. Chiedere un caffè in Italia significa, quasi sempre, chiedere un "
            "espresso."
        ),
    },
    {
        "id": "doc-pt-001",
        "url": "https://www.example.com.br/dicas/economizar-agua",
        "text": (
            "Dez minutos a menos no banho: como economizar água em casa\n\n"
            "A maior parte da água que gastamos em casa vai embora no chuveiro, na descarga e na torneira da cozinha. "
            "Pequenas mudanças nesses três pontos já fazem uma diferença grande na conta no fim do mês e ajudam a "
            "enfrentar os períodos de seca, cada vez mais comuns em muitas cidades.\n\n"
            "No banho, fechar o registro enquanto se ensaboa pode reduzir o consumo pela metade. Na pia, lavar a louça "
            "com a torneira aberta o tempo todo é um dos maiores desperdícios: o ideal é ensaboar tudo primeiro e "
            "enxaguar de uma vez. Vazamentos também merecem atenção. Uma torneira pingando parece inofensiva, mas "
            "pode desperdiçar dezenas de litros por dia.\n\n"
            "Quem tem quintal pode instalar uma cisterna simples para aproveitar a água da chuva na limpeza da "
            "calçada e na rega das plantas. E a água da máquina de lavar, já com sabão, serve muito bem para lavar o "
            "chão da área de serviço."
        ),
    },
    {
        "id": "doc-nl-001",
        "url": "https://www.example.nl/winter/natuurijs",
        "text": (
            "Schaatsen op natuurijs: waar moet je op letten?\n\n"
            "Zodra het een paar nachten flink vriest, trekken duizenden Nederlanders met hun schaatsen naar de sloten "
            "en plassen. Schaatsen op natuurijs is een van de mooiste winterervaringen die er bestaan, maar het is "
            "ook niet zonder risico.\n\n"
            "De belangrijkste regel is dat je nooit alleen het ijs op gaat. Ijs kan op de ene plek tien centimeter dik "
            "zijn en een paar meter verder, bij een duiker of onder een brug, veel dunner. Stromend water, riet en "
            "plekken waar eenden zwemmen bevriezen slechter. Let ook op scheuren en op ijs dat er grijs of "
            "donker uitziet.\n\n"
            "Neem altijd een touw en een paar ijsprikkers mee. Zak je toch door het ijs, probeer dan niet meteen "
            "omhoog te klimmen, maar ga plat op je buik liggen en schuif terug in de richting waar je vandaan kwam. "
            "Ijsverenigingen geven via hun website en de lokale omroep door welke banen veilig zijn."
        ),
    },
    {
        "id": "doc-pl-001",
        "url": "https://www.example.pl/poradnik/grzybobranie",
        "text": (
            "Grzybobranie dla początkujących\n\n"
            "Jesienią polskie lasy pełne są ludzi z koszykami. Grzybobranie to dla wielu rodzin tradycja przekazywana "
            "z pokolenia na pokolenie, ale także zajęcie, które wymaga ostrożności. Co roku zdarzają się zatrucia, "
            "najczęściej u osób, które zbierają grzyby bez odpowiedniej wiedzy.\n\n"
            "Podstawowa zasada jest prosta: zbieramy tylko te grzyby, które znamy na pewno. Początkującym najlepiej "
            "ograniczyć się do kilku łatwych gatunków, takich jak borowik szlachetny, podgrzybek czy maślak. Grzyby "
            "z blaszkami pod kapeluszem wymagają dużo większego doświadczenia, bo wśród nich są gatunki śmiertelnie "
            "trujące, na przykład muchomor zielonawy.\n\n"
            "Grzyby należy wykręcać lub ostrożnie wycinać nożem, a potem przykryć miejsce ściółką. Do zbierania nadaje "
            "się wiklinowy koszyk, a nie plastikowa torba, w której grzyby szybko się psują. Po powrocie do domu "
            "warto je od razu oczyścić i przygotować jeszcze tego samego dnia."
        ),
    },
    {
        "id": "doc-ru-001",
        "url": "https://www.example.ru/sovety/kak-vybrat-velosiped",
        "text": (
            "Как выбрать первый велосипед для города\n\n"
            "Перед покупкой велосипеда стоит честно ответить себе на вопрос, где и как часто вы будете на нём ездить. "
            "Для поездок по городу на работу или в магазин не нужен тяжёлый горный велосипед с мощной амортизацией: "
            "он медленнее и требует больше сил на ровном асфальте.\n\n"
            "Гораздо удобнее городской или гибридный велосипед с колёсами среднего размера, крыльями и багажником. "
            "Обязательно проверьте размер рамы: стоя над велосипедом, между рамой и телом должно оставаться несколько "
            "сантиметров. Седло настраивают так, чтобы в нижней точке нога была почти прямой.\n\n"
            "Не экономьте на тормозах и освещении, а также купите хороший замок. Первые несколько недель катайтесь по "
            "тихим улицам и паркам, чтобы привыкнуть к управлению, и только потом выезжайте на загруженные дороги."
        ),
    },
    {
        "id": "doc-ja-001",
        "url": "https://www.example.jp/kurashi/toshokan",
        "text": (
            "図書館をもっと楽しむための小さな工夫\n\n"
            "図書館は本を借りるだけの場所だと思われがちですが、実はさまざまな使い方ができます。多くの図書館では、"
            "インターネットで本を予約して、近くの分館で受け取ることができます。人気のある本は順番待ちになりますが、"
            "予約しておけば、順番が来たときにメールで知らせてもらえます。\n\n"
            "また、新聞や雑誌のバックナンバーを読んだり、地域の歴史に関する資料を調べたりすることもできます。"
            "調べものに困ったときは、カウンターの司書に相談してみましょう。どの本を読めばよいか、"
            "どの資料に答えがあるかを一緒に探してくれます。\n\n"
            "週末には子ども向けの読み聞かせ会や、大人向けの講座を開いている図書館も少なくありません。"
            "近所の図書館の案内を一度じっくり読んでみると、思わぬ発見があるかもしれません。"
        ),
    },
    {
        "id": "doc-zh-001",
        "url": "https://www.example.cn/shenghuo/chengshi-qixing",
        "text": (
            "城市骑行，让通勤变成一种享受\n\n"
            "越来越多的上班族开始选择骑自行车通勤。和挤地铁、开车相比，骑车不仅可以避开早晚高峰的拥堵，"
            "还能顺便锻炼身体。对于距离在五公里以内的路程，骑车往往比其他交通方式更快。\n\n"
            "刚开始骑车通勤时，最好提前规划好路线，尽量选择有非机动车道、车流量较少的道路。"
            "出门前检查一下轮胎气压和刹车，夜间骑行一定要打开车灯，穿颜色鲜艳的衣服。"
            "如果公司没有洗澡的地方，可以放慢速度，或者带一件换洗的衣服。\n\n"
            "坚持一段时间以后，很多人会发现，每天路上的这二十分钟，反而成了一天中最放松的时光。"
        ),
    },
    {
        "id": "doc-ar-001",
        "url": "https://www.example.com/ar/thaqafa/alqahwa-alarabiya",
        "text": (
            "القهوة العربية: أكثر من مجرد مشروب\n\n"
            "في كثير من البلدان العربية تعد القهوة رمزاً للكرم وحسن الضيافة. فعندما يدخل الضيف إلى البيت، "
            "يكون تقديم القهوة من أول ما يقوم به أهل الدار، وغالباً ما تقدم مع التمر.\n\n"
            "تختلف القهوة العربية عن غيرها في طريقة تحضيرها. فالبن يحمص تحميصاً خفيفاً، ثم يغلى مع الماء في دلة "
            "نحاسية، ويضاف إليه الهيل وأحياناً الزعفران أو القرنفل. وتقدم القهوة في فناجين صغيرة بلا مقابض، "
            "ولا يملأ الفنجان إلا إلى ثلثه تقريباً.\n\n"
            "ولتقديم القهوة آداب معروفة، فالمضيف يمسك الدلة بيده اليسرى ويقدم الفنجان باليمنى، ويبدأ بالضيف الأكبر "
            "سناً أو الأعلى مكانة. وإذا اكتفى الضيف هز الفنجان بلطف قبل أن يعيده."
        ),
    },
    {
        "id": "doc-sv-001",
        "url": "https://www.example.se/friluftsliv/allemansratten",
        "text": (
            "Allemansrätten: vad får man göra i naturen?\n\n"
            "I Sverige har alla rätt att röra sig fritt i naturen, även på mark som ägs av någon annan. Allemansrätten "
            "är ingen lag i sig, utan en gammal sedvana som skyddas i grundlagen. Den ger stora friheter, men också "
            "ett ansvar att inte störa och inte förstöra.\n\n"
            "Du får vandra, cykla och åka skidor i skog och mark, plocka bär, svamp och blommor som inte är fridlysta, "
            "och tälta en natt eller två på samma plats, så länge du inte är för nära ett hus. Däremot får du inte gå "
            "över någons tomt, köra bil i terrängen eller elda när det är torrt och eldningsförbud råder.\n\n"
            "Det enklaste sättet att komma ihåg reglerna är devisen: inte störa, inte förstöra."
        ),
    },
    # --- low-quality documents for the quality filters ---------------------------------
    {
        "id": "junk-spam-001",
        "url": "https://cheap-flights-deals.example/best",
        "text": (
            "cheap flights cheap flights best cheap flights cheap flights deals cheap flights " * 12
        ).strip(),
    },
    {
        "id": "junk-bullets-001",
        "url": "https://shop.example/landing",
        "text": "\n".join(
            [
                "• Buy now",
                "• Buy now",
                "• Free shipping",
                "• Buy now",
                "• Limited offer",
                "• Buy now",
                "• Best price",
                "• Buy now",
                "• Order today",
                "• Buy now",
                "• Free shipping",
                "• Buy now",
            ]
        ),
    },
    {
        "id": "junk-lorem-001",
        "url": "https://newsite.example/about",
        "text": (
            "About us\n\n"
            "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
            "dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip "
            "ex ea commodo consequat. Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu "
            "fugiat nulla pariatur.\n\n"
            "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Excepteur sint occaecat cupidatat non proident, "
            "sunt in culpa qui officia deserunt mollit anim id est laborum."
        ),
    },
    {
        "id": "junk-ellipsis-001",
        "url": "https://forum.example/thread/123?page=9",
        "text": "\n".join(
            [
                "Loading...",
                "...",
                "Read more...",
                "...",
                "Comments are loading...",
                "...",
                "Show more...",
                "...",
                "...",
                "Please wait...",
            ]
        ),
    },
    {"id": "junk-short-001", "url": "https://example.com/p/1", "text": "Click here for more info."},
    {
        "id": "junk-js-001",
        "url": "https://app.example.com/dashboard",
        "text": (
            "Please enable JavaScript to view this page.\n"
            "This site requires JavaScript to function properly. Please enable JavaScript in your browser "
            "settings and reload the page."
        ),
    },
    {
        "id": "junk-nav-001",
        "url": "https://example.com/sitemap",
        "text": (
            "Home | About | Products | Services | Blog | Careers | Contact\n"
            "Privacy Policy | Terms of Use | Cookie Settings | Accessibility\n"
            "Login | Register | Forgot password?\n"
            "© 2024 Example Corp. All rights reserved."
        ),
    },
    {"id": "doc-empty-001", "url": "https://example.com/blank", "text": "   \n\n  \t \n"},
    # --- fake PII (documentation ranges and test values only) --------------------------
    {
        "id": "pii-en-001",
        "url": "https://forum.example.org/t/sync-fails-after-update/4411",
        "text": (
            "Sync fails after updating to 3.11.2\n\n"
            "Hi all, since updating the desktop client to version 3.11.2 on 2024-05-01, syncing stops after a few "
            "minutes with a timeout. I rolled back to 3.10.7 and everything works again. My setup: the server runs on "
            "192.0.2.10, and the client connects over IPv6 to 2001:db8::1 on port 8443.\n\n"
            "I already opened a ticket but nobody replied, so you can contact me directly at jane.doe@example.com or "
            "call +1 555 0100 during office hours. I paid for the pro plan ($49.99 per year, renewed on 2024-04-15 "
            "with the card 4111 1111 1111 1111), so I expected faster support.\n\n"
            "Here is the relevant part of my config file, in case it helps:\n\n"
            "    server_url = https://sync.example.com:8443\n"
            "    api_key = sk_live_7Qm2Rk9Xw4Lp8Zt1Vb6Nc3Hd\n"
            "    retries = 3\n"
            "    timeout_seconds = 30\n\n"
            'The log says "connection reset after 30.0s" and then "retrying (2/3)". Any ideas? Thanks!'
        ),
    },
    {
        "id": "pii-en-002",
        "url": "https://wiki.example.org/team/onboarding",
        "text": (
            "New starter checklist for the data team\n\n"
            "Welcome aboard! Your line manager is Sam Rivera (sam.rivera@example.org, extension 0142). For laptop "
            "problems, write to it-help@example.net or ring the help desk on (555) 010-0199. Out of hours, the on-call "
            "number is +44 20 7946 0958.\n\n"
            "Before your first day, please make sure you can reach the staging server at 198.51.100.23 and the "
            "monitoring dashboard at 203.0.113.7. Both are only reachable over the VPN.\n\n"
            "Do not paste personal tokens into chat. Last month somebody shared ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8 "
            "in a public channel and we had to rotate every deploy key. Store tokens in the password manager instead.\n\n"
            "The coffee machine on the third floor costs 0.80 per cup, the team lunch budget is 15.00 per person, and "
            "the quarterly planning meeting is on 2024-07-03 at 10:30 in room 4.12."
        ),
    },
    {
        "id": "pii-de-001",
        "url": "https://verein.example.de/kontakt",
        "text": (
            "Kontakt und Mitgliedsbeitrag\n\n"
            "Fragen zur Mitgliedschaft beantwortet unsere Kassenwartin Maria Beispiel gerne per E-Mail an "
            "maria.beispiel@example.de. Bitte geben Sie dabei Ihre Mitgliedsnummer an.\n\n"
            "Der Jahresbeitrag beträgt 36,00 Euro für Erwachsene und 18,00 Euro für Schüler und Studierende. "
            "Überweisen Sie den Betrag bitte bis zum 31.03.2024 auf das Vereinskonto mit der IBAN "
            'DE89 3704 0044 0532 0130 00 und dem Verwendungszweck "Beitrag 2024".\n\n'
            "Unsere Vereinssoftware wurde am 2024-02-12 auf Version 2.4.1 aktualisiert. Falls die Anmeldung im "
            "Mitgliederbereich nicht klappt, melden Sie sich bitte unter support@example.de."
        ),
    },
    # --- raw HTML instead of text ------------------------------------------------------
    {
        "id": "html-en-001",
        "url": "https://www.example.org/recipes/lentil-soup",
        "html": (
            "<html><head><title>Weeknight red lentil soup</title><script>track('recipe')</script></head><body>"
            "<nav><a href='/'>Home</a> <a href='/recipes'>Recipes</a> <a href='/about'>About</a></nav>"
            "<article><h1>Weeknight red lentil soup</h1>"
            "<p>This is the soup I make when the fridge is nearly empty and everyone is hungry. Red lentils cook "
            "in about twenty minutes and fall apart on their own, so there is no need for a blender.</p>"
            "<p>Soften a chopped onion, two carrots and a stick of celery in olive oil. Add a spoonful of cumin, "
            "a pinch of chilli flakes and a tablespoon of tomato paste, and stir for a minute until it smells "
            "toasty. Tip in two hundred grams of rinsed lentils and a litre of stock, then simmer until thick.</p>"
            "<p>Finish with the juice of half a lemon and plenty of black pepper. It keeps for three days in the "
            "fridge and tastes even better on the second day.</p></article>"
            "<footer>&copy; 2024 Example Kitchen</footer></body></html>"
        ),
    },
    {
        "id": "html-fr-001",
        "url": "https://www.example.fr/sorties/marche-de-noel",
        "html": (
            "<!DOCTYPE html><html lang='fr'><head><meta charset='utf-8'><title>Le marché de Noël revient</title>"
            "<style>.menu{display:flex}</style></head><body>"
            "<div class='menu'><a href='/'>Accueil</a><a href='/sorties'>Sorties</a><a href='/agenda'>Agenda</a></div>"
            "<div id='cookies'>Ce site utilise des cookies. <button>OK</button></div>"
            "<div class='article'><h1>Le marché de Noël revient sur la place de la Mairie</h1>"
            "<p>À partir du premier samedi de décembre, une quarantaine de chalets en bois s'installeront de nouveau "
            "sur la place de la Mairie. Artisans, producteurs locaux et associations y proposeront des décorations, "
            "des jouets en bois, du fromage, du pain d'épices et, bien sûr, du vin chaud.</p>"
            "<p>Cette année, une petite patinoire sera montée à côté de la fontaine, et une chorale d'enfants "
            "chantera chaque dimanche après-midi. Le marché sera ouvert tous les jours de dix heures à vingt heures, "
            "jusqu'au vingt-quatre décembre.</p></div>"
            "<footer>© Ville d'Exemple</footer></body></html>"
        ),
    },
    {
        "id": "html-de-001",
        "url": "https://www.example.de/technik/router-neustarten",
        "html": (
            '<html lang="de"><head><title>Router neu starten – so geht es richtig</title></head><body>'
            '<header><ul><li><a href="/">Start</a></li><li><a href="/technik">Technik</a></li></ul></header>'
            "<main><h1>Router neu starten – so geht es richtig</h1>"
            "<p>Wenn das Internet plötzlich langsam wird oder die Verbindung ganz abbricht, hilft erstaunlich oft "
            "ein einfacher Neustart des Routers. Dabei kommt es allerdings auf die richtige Reihenfolge an.</p>"
            "<p>Ziehen Sie zuerst den Stecker aus der Steckdose und warten Sie mindestens dreißig Sekunden. So "
            "entladen sich die Kondensatoren vollständig und der Speicher wird wirklich geleert. Stecken Sie das "
            "Gerät danach wieder ein und geben Sie ihm zwei bis drei Minuten Zeit, bis alle Lämpchen dauerhaft "
            "leuchten. Erst dann lohnt es sich, Computer und Smartphone erneut zu verbinden.</p></main>"
            "<script>window.ads=[1,2,3];</script></body></html>"
        ),
    },
    # --- text normalisation ------------------------------------------------------------
    {
        "id": "mojibake-en-001",
        "url": "https://www.example.org/blog/corner-cafe",
        "text": make_mojibake(
            "The café on the corner\n\n"
            "Every neighbourhood needs a place like it: a café where the owner remembers your order, the "
            "croissants are still warm at nine, and nobody minds if you stay for an hour with one coffee. Ours "
            "opened in 2015 and has barely changed since – the same chipped blue cups, the same radio, the same "
            "handwritten sign that says “back in 5 minutes”.\n\n"
            "Last winter, when the rent went up, regulars organised a little fundraiser. Somebody’s daughter "
            "designed a poster, the bakery next door donated a cake, and the crème brûlée evening raised enough "
            "to cover three months. It’s a small story, but it says a lot about what a café really is: not just a "
            "business, but a kind of living room for the street."
        ),
    },
    {
        "id": "unicode-en-001",
        "url": "https://www.example.org/notes/unicode",
        "text": (
            "Ｆｕｌｌｗｉｄｔｈ letters, ligatures and invisible characters\n\n"
            "Text copied from PDFs and old word processors often carries odd characters. The word “ﬁnance” may "
            "contain a single ligature glyph instead of the letters f and i, and a heading may be typed in "
            "ｆｕｌｌｗｉｄｔｈ forms borrowed from East Asian typography.\n\n"
            "Other characters cannot be seen at all. A zero\u200bwidth space can hide inside a word, a soft hyphen "
            "can sit in the middle of en\u00adcyclopedia, and a non\u00a0breaking space looks exactly like a normal one. "
            "Some files even contain stray control characters\u0007 left over from terminal output. Normalising this "
            "text before deduplication and tokenisation means that two copies of the same sentence really do "
            "compare as equal, whichever program they passed through on the way."
        ),
    },
]

# Deliberately bad lines, inserted after these many good records.
BAD_LINES = [
    (20, '{"id": "broken-001", "url": "https://example.com/broken", "text": "unterminated'),
    (31, "[1, 2, 3]"),
]


def write_docs(out: Path) -> None:
    lines = [json.dumps(d, ensure_ascii=False) for d in DOCS]
    for pos, bad in sorted(BAD_LINES, reverse=True):
        lines.insert(pos, bad)
    (out / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="sample folder (default: %(default)s)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_pages(args.out)
    write_warc(args.out)
    write_docs(args.out)
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            print(f"{p.stat().st_size:>8}  {p.relative_to(args.out)}")


if __name__ == "__main__":
    main()
