// mvg_dask documentation: a notebook's figure (an <img> without a link) opens at full size when
// clicked, as the Markdown pages' scaled figures do (tests/test_docs_browser.py checks it).
document.addEventListener("DOMContentLoaded", () => {
  for (const img of document.querySelectorAll(".bd-article div.cell_output img")) {
    if (img.closest("a")) continue;
    const link = document.createElement("a");
    link.href = img.src;
    link.title = "open the figure at full size";
    img.replaceWith(link);
    link.appendChild(img);
  }
});
