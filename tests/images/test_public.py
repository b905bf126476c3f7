"""The exported names of dsec.images are the intended ones."""

import dsec.images


def test_exports():
    assert set(dsec.images.__all__) == {
        "ImageService", "ResolvedImage", "ImageConfig", "ImageInfo", "LayerInfo", "LayerRef",
        "Manifest", "CorruptBlob", "TarLimits", "RemoteConfig", "BuildSpec", "BuildFailed", "GcPlan"}
    for name in dsec.images.__all__:
        assert getattr(dsec.images, name)
