// One page's layout facts as the browser measures them (tests/test_docs_browser.py).
const article = document.querySelector('.bd-article');
const pad = article ? getComputedStyle(article) : null;
const aw = article
  ? article.clientWidth - parseFloat(pad.paddingLeft) - parseFloat(pad.paddingRight)
  : 0;
const overflowing = (el) => el.scrollWidth > el.clientWidth + 1;
const scrolls = (el) => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
const cut = [];
for (const t of document.querySelectorAll('.bd-article table')) {
  let box = t.parentElement;
  while (box && box !== article && !scrolls(box)) box = box.parentElement;
  const r = t.getBoundingClientRect();
  const inside = box && box !== article && scrolls(box)
      && box.getBoundingClientRect().right <= window.innerWidth + 1;
  if (r.right > window.innerWidth + 1 && !inside) cut.push('table: ' + t.innerText.slice(0, 40));
  if (r.width > aw + 1 && !inside) {
    cut.push('table wider than the article: ' + t.innerText.slice(0, 40));
  }
}
for (const pre of document.querySelectorAll('.bd-article pre')) {
  if (overflowing(pre) && !scrolls(pre)) cut.push('pre: ' + pre.innerText.slice(0, 40));
}
const figures = [];
for (const img of document.querySelectorAll('.bd-article img')) {
  const link = img.closest('a');
  figures.push({
    src: img.currentSrc,
    natural: img.naturalWidth,
    shown: img.getBoundingClientRect().width,
    href: link ? link.href : null,
  });
}
return {
  sidebar: document.querySelectorAll('nav.bd-docs-nav a').length,
  cut: cut,
  figures: figures,
  article: aw,
  placeholders: document.getElementsByTagName('scratch').length
    + document.getElementsByTagName('repo').length,
  text_placeholders:
    ((document.body ? document.body.innerText : '').match(/<scratch>/g) || []).length,
  local_links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))
      .filter(h => /^https?:\/\/(127\.0\.0\.1|localhost|\[::1\])/.test(h)),
  remote_scripts: [...document.querySelectorAll('script[src]')].map(s => s.getAttribute('src'))
      .filter(s => /^(https?:)?\/\//.test(s)),
};
