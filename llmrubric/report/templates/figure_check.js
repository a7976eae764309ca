window.addEventListener('load', () => {
  const images = Array.from(document.images);
  const loaded = images.filter(i => i.complete && i.naturalWidth > 0).length;
  const el = document.getElementById('figure-check');
  el.dataset.loaded = loaded; el.dataset.total = images.length;
  el.textContent = loaded + ' of ' + images.length + ' figures loaded';
});
