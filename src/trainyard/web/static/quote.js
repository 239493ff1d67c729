// Load a spec file chosen in the file picker into the text area (nothing is sent until "Quote").
(function () {
  var input = document.getElementById("spec-file");
  var area = document.getElementById("spec");
  if (!input || !area) return;
  input.addEventListener("change", function () {
    var f = input.files && input.files[0];
    if (!f) return;
    var reader = new FileReader();
    reader.onload = function () { area.value = String(reader.result || ""); };
    reader.readAsText(f);
  });
})();
