// A select marked data-autosubmit submits its form when it changes. Inline onchange handlers are
// blocked by the page's Content-Security-Policy, so this one delegated listener stands in for them.
document.addEventListener("change", (event) => {
  const field = event.target;
  if (field instanceof HTMLSelectElement && field.dataset.autosubmit !== undefined && field.form) {
    field.form.requestSubmit();
  }
});
