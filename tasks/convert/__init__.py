"""Convert to Image Directory: a folder, archive or S3 prefix of images becomes an ImageDirectory.

    sources.py     where images come from, as types behind one interface: FolderSource, ArchiveSource;
                   s3_source.py the S3Source; locations.py picks one for a location (``open_source``)
    archives.py    unpacking .zip / .tar(.gz|.bz2|.xz) safely: no member lands outside, sizes are capped
    listing.py     one walk of a local folder: what can be read, what was skipped and why
    labelling.py   which file has which label: class folders, a labels file, or none
    labels_file.py a labels file read: CSV or JSON, its encoding
    plan.py        what a conversion will store: the rules each file is judged by, the plan walked
    storing.py     checking and storing one image, and whose fault a failure is
    output_folder.py  where a conversion writes: the partial folder, writes that tell a storage fault, the journal
    conversion.py  the plan, the space check, the threads, the manifest (``convert_to_image_directory``)
    prefect_tasks.py  the ``convert`` Prefect task and its artifacts; the only module here that imports Prefect

Nothing is imported here: ``convert_to_image_directory`` is imported from ``tasks.convert.conversion`` and the
task ``convert`` from ``tasks.convert.prefect_tasks``, so that importing the package imports no Prefect.
"""
